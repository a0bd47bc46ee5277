"""`--api-key`: every endpoint but /health wants `Authorization: Bearer <key>`."""

from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from support.api_helpers import TIMEOUT_S, assert_error
from support.servers import launch_server

pytestmark = pytest.mark.slow

KEY = "sekret-key"
GENERATE = {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.fixture(scope="module")
def secured():
    with launch_server(api_key=KEY) as handle:
        yield handle


def test_health_needs_no_key(secured):
    assert requests.get(secured.url + "/health", timeout=TIMEOUT_S).status_code == 200
    assert requests.get(secured.url + "/ready", timeout=TIMEOUT_S).status_code == 200  # SGLang's readiness probe
    for method in ("GET", "POST"):  # vLLM's /ping, the probe SageMaker sends
        assert requests.request(method, secured.url + "/ping", timeout=TIMEOUT_S).status_code == 200


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}], ids=["missing", "wrong", "no-bearer"]
)
@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "/generate"),
        ("GET", "/metrics"),
        ("GET", "/cache_info"),
        ("GET", "/v1/models"),
        ("POST", "/flush_cache"),
        ("POST", "/start_profile"),
        ("POST", "/stop_profile"),
        ("POST", "/invocations"),
        ("POST", "/vertex_generate"),
    ],
)
def test_requests_without_the_key_are_refused(secured, headers, method, path):
    resp = requests.request(method, secured.url + path, json=GENERATE, headers=headers, timeout=TIMEOUT_S)
    assert_error(resp, 401, "API key")


def test_the_key_opens_every_endpoint(secured):
    resp = requests.post(secured.url + "/generate", json=GENERATE, headers=secured.headers(), timeout=TIMEOUT_S)
    assert resp.status_code == 200 and resp.json()["meta_info"]["completion_tokens"] <= 2
    assert requests.get(secured.url + "/metrics", headers=secured.headers(), timeout=TIMEOUT_S).status_code == 200


def test_openai_sdk_with_and_without_the_key(secured):
    good = openai.OpenAI(base_url=secured.url + "/v1", api_key=KEY, timeout=120, max_retries=0)
    model = good.models.list().data[0].id
    assert good.completions.create(model=model, prompt="Hi", max_tokens=2, temperature=0).choices
    bad = openai.OpenAI(base_url=secured.url + "/v1", api_key="wrong", timeout=120, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_anthropic_clients_send_the_key_as_x_api_key(secured):
    good = anthropic.Anthropic(base_url=secured.url, api_key=KEY, timeout=TIMEOUT_S, max_retries=0)
    message = good.messages.create(model="any", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert message.usage.output_tokens <= 2
    generated = requests.post(secured.url + "/generate", json=GENERATE, headers={"x-api-key": KEY}, timeout=TIMEOUT_S)
    assert generated.status_code == 200
    bad = anthropic.Anthropic(base_url=secured.url, api_key="wrong", timeout=TIMEOUT_S, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        bad.messages.count_tokens(model="any", messages=[{"role": "user", "content": "Hi"}])
    assert raised.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in raised.value.body["error"]["message"]
