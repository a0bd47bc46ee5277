"""Every class of bad input gets a 4xx JSON error naming the problem, and the server keeps
serving: a valid request right after each one succeeds."""

from __future__ import annotations

import gzip
import json

import pytest
import requests

from support.api_helpers import TIMEOUT_S, assert_error, generate, post

pytestmark = pytest.mark.slow

TEXT = "Hello there"
CONTEXT = 8192
CHAT = [{"role": "user", "content": TEXT}]


def sampling(**params) -> dict:
    return {"text": TEXT, "sampling_params": {"max_new_tokens": 2, **params}}


NATIVE_CASES = {
    "not an object": ([1, 2, 3], "must be a JSON object, not an array"),
    "text of the wrong type": ({"text": 123}, "text"),
    "neither text nor input_ids": ({"sampling_params": {"max_new_tokens": 2}}, "text"),
    "both text and input_ids": ({"text": TEXT, "input_ids": [1, 2]}, "exactly one"),
    "empty text": ({"text": ""}, "empty"),
    "empty batch": ({"text": []}, "empty"),
    "empty input_ids": ({"input_ids": []}, "empty"),
    "float token id": ({"input_ids": [1.5, 2]}, "input_ids"),
    "negative token id": ({"input_ids": [5, -1]}, "input_ids"),
    "temperature of the wrong type": (sampling(temperature="hot"), "temperature"),
    "negative temperature": (sampling(temperature=-0.5), "temperature"),
    "top_p zero": (sampling(top_p=0), "top_p"),
    "top_p above one": (sampling(top_p=1.5), "top_p"),
    "top_k zero": (sampling(top_k=0), "top_k"),
    "min_p above one": (sampling(min_p=2), "min_p"),
    "negative max_new_tokens": (sampling(max_new_tokens=-1), "max_new_tokens"),
    "n zero": (sampling(n=0), "n"),
    "n too large": (sampling(n=65), "n"),
    "frequency_penalty out of range": (sampling(frequency_penalty=3), "frequency_penalty"),
    "repetition_penalty zero": (sampling(repetition_penalty=0), "repetition_penalty"),
    "unknown sampling parameter": (sampling(max_new_token=5), "max_new_token"),
    "regex and json_schema together": (sampling(regex="[ab]+", json_schema='{"type": "object"}'), "at most one"),
    "sampling_params list for one prompt": ({"text": TEXT, "sampling_params": [{}, {}]}, "batch"),
    "sampling_params list of the wrong length": ({"text": [TEXT, TEXT], "sampling_params": [{}]}, "sampling_params"),
    "top-level max_tokens negative": ({"text": TEXT, "max_tokens": -3}, "max_tokens"),
    # values that once reached the router and ended it (integers its arrays cannot hold)
    "token id of 2**64 - 1": ({"input_ids": [1, 2**64 - 1]}, "input_ids"),
    "token id of 2**63": ({"input_ids": [1, 2**63]}, "input_ids"),
    "seed of 2**63": (sampling(seed=2**63), "seed"),
    "top_k of 2**63": (sampling(top_k=2**63), "top_k"),
    "stop token id of 2**63": (sampling(stop_token_ids=[2**63]), "stop_token_ids"),
    "max_new_tokens of 2**63": (sampling(max_new_tokens=2**63), "max_new_tokens"),
    "max_new_tokens beyond the context": (sampling(max_new_tokens=CONTEXT), "context length"),
    "a 200,000-character stop string": (sampling(stop="x" * 200_000), "stop"),
    "10,000 stop strings": (sampling(stop=["x"] * 10_000), "stop"),
    "a 100 KiB JSON schema": (
        sampling(json_schema={"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(4000)}}),
        "json_schema",
    ),
    "2,000 prompts x n=64": ({"text": [TEXT] * 2000, "sampling_params": {"n": 64, "max_new_tokens": 1}}, "256"),
    "deadline of zero": ({"text": TEXT, "deadline_s": 0}, "deadline_s"),
    "10,000 stop regexes": (sampling(stop_regex=["x"] * 10_000), "stop_regex"),
    "a stop regex that backtracks without end": (
        {"text": "x", "sampling_params": {"max_new_tokens": 100, "regex": "x{100}", "stop_regex": "(x|xx)+y"}},
        "simplify it",
    ),
    "a text longer than any prompt": ({"text": "hello " * 120_000, "max_tokens": 2}, "characters"),
    "a 200,000-character cache_salt": ({"text": TEXT, "cache_salt": "s" * 200_000}, "cache_salt"),
}

# more of something than the context (8192) has tokens: refused before it is read item by item
MANY = 8193
OPENAI_CASES = {
    "chat of more messages than the context has tokens": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a"}] * MANY},
        "8193 items; this model's context of 8192 tokens",
    ),
    "response of more content parts than the context has tokens": (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * MANY}]},
        "input.0.message.content: 8193 items",
    ),
    # SGLang's and vLLM's vision examples, sent to a model that reads text
    "chat with an image part": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
        "messages.0.content: content parts of type 'image_url' are not supported: the served model reads text",
    ),
    "function's output with an image part": (
        "/v1/responses",
        {"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]},
        "input.0.function_call_output.output: content parts of type 'input_image' are not supported",
    ),
    "response with an image part": (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
        "input.0.message.content: content parts of type 'input_image' are not supported",
    ),
    "completion of more token ids than the context": ("/v1/completions", {"prompt": [504] * MANY}, "8193 token ids"),
    "chat with an unknown role": ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    "chat without messages": ("/v1/chat/completions", {"messages": []}, "messages"),
    "chat with a bad response_format": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}},
        "response_format",
    ),
    "chat with negative max_tokens": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1},
        "max_tokens",
    ),
    "completion with a logit_bias beyond 100": ("/v1/completions", {"prompt": TEXT, "logit_bias": {"28": 1e9}}, "100"),
    "chat with a logit_bias on a word": (
        "/v1/chat/completions",
        {"messages": CHAT, "logit_bias": {"Paris": 5}},
        "integer",
    ),
    "completion with a logit_bias outside the vocabulary": (
        "/v1/completions",
        {"prompt": TEXT, "logit_bias": {"4000000": 5}},
        "outside the vocabulary",
    ),
    "completion with a suffix": ("/v1/completions", {"prompt": TEXT, "suffix": " the end."}, "suffix"),
    "completion with an empty prompt": ("/v1/completions", {"prompt": ""}, "empty"),
    "completion without a prompt": ("/v1/completions", {"max_tokens": 3}, "prompt"),
    "completion with top_p zero": ("/v1/completions", {"prompt": TEXT, "top_p": 0}, "top_p"),
    "completion with regex and json_schema": (
        "/v1/completions",
        {"prompt": TEXT, "regex": "a+", "json_schema": "{}"},
        "at most one",
    ),
    "completion token id of 2**64 - 1": ("/v1/completions", {"prompt": [1, 2**64 - 1]}, "prompt"),
    "completion seed of 2**64 - 1": ("/v1/completions", {"prompt": TEXT, "seed": 2**64 - 1}, "seed"),
    "chat seed of 2**63": ("/v1/chat/completions", {"messages": CHAT, "seed": 2**63}, "seed"),
    "chat top_k of 2**63": ("/v1/chat/completions", {"messages": CHAT, "top_k": 2**63}, "top_k"),
    "chat max_tokens of 2**63": ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2**63}, "max_tokens:"),
    "chat stop bomb": ("/v1/chat/completions", {"messages": CHAT, "stop": ["y" * 200_000]}, "stop"),
    "chat template kwargs that set the messages": (
        "/v1/chat/completions",
        {"messages": CHAT, "chat_template_kwargs": {"messages": []}},
        "chat_template_kwargs may not set messages",
    ),
    "chat tool call of no tool": (
        "/v1/chat/completions",
        {"messages": CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}},
        "tool_choice needs tools",
    ),
    "completion fan-out": ("/v1/completions", {"prompt": [TEXT] * 20_000, "n": 64}, "256"),
}

# tokenizing runs on the router's loop: no call may hold it up for long
TOKENIZER_CASES = {
    "tokenize bomb": ("/tokenize", {"prompt": ["hello " * 60_000] * 2}, "characters"),
    "detokenize bomb": ("/detokenize", {"tokens": [504] * 700_000}, "token ids"),
    "tokenize a chat of more messages than the context has tokens": (
        "/tokenize",
        {"messages": [{"role": "user", "content": "a"}] * MANY},
        "messages: 8193 items",
    ),
}


@pytest.fixture()
def still_serves(server):
    """After the bad request, a good one must still be answered."""
    yield
    assert generate(server, TEXT, max_new_tokens=1)["meta_info"]["completion_tokens"] <= 1


@pytest.mark.parametrize("body,word", NATIVE_CASES.values(), ids=NATIVE_CASES.keys())
def test_native_request_validation(server, still_serves, body, word):
    assert_error(post(server, "/generate", body), 400, word)


@pytest.mark.parametrize("path,body,word", OPENAI_CASES.values(), ids=OPENAI_CASES.keys())
def test_openai_request_validation(server, still_serves, path, body, word):
    assert_error(post(server, path, body), 400, word)


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {"prompt": TEXT, "logit_bias": {"4000000": 5}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"49152": 1}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": CONTEXT}, "max_tokens"),
        ("/v1/completions", {"prompt": [504, 49152]}, None),  # the router has no name for the prompt's field
    ],
)
def test_the_routers_refusals_name_the_field_at_fault(server, still_serves, path, body, param):
    """Refusals only the router can make (the vocabulary, the context) name the client's field too."""
    resp = post(server, path, body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize("path,body,word", TOKENIZER_CASES.values(), ids=TOKENIZER_CASES.keys())
def test_tokenizer_endpoint_bounds(server, still_serves, path, body, word):
    assert_error(post(server, path, body), 400, word)


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_malformed_json(server, still_serves, path):
    resp = requests.post(
        server.url + path,
        data=b'{"text": "hi",',
        headers={**server.headers(), "Content-Type": "application/json"},
        timeout=TIMEOUT_S,
    )
    assert_error(resp, 400, "invalid JSON")


def test_empty_body(server, still_serves):
    resp = requests.post(server.url + "/generate", data=b"", headers=server.headers(), timeout=TIMEOUT_S)
    assert_error(resp, 400, "empty")


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions"])
def test_a_compressed_body_is_a_415_saying_so(server, still_serves, path):
    body = gzip.compress(b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}}')
    headers = {**server.headers(), "Content-Type": "application/json", "Content-Encoding": "gzip"}
    resp = requests.post(server.url + path, data=body, headers=headers, timeout=TIMEOUT_S)
    assert_error(resp, 415, "Content-Encoding 'gzip' is not supported")


def test_oversized_body(server, still_serves):
    body = b'{"text": "' + b"a" * (17 * 2**20) + b'"}'
    resp = requests.post(
        server.url + "/generate",
        data=body,
        headers={**server.headers(), "Content-Type": "application/json"},
        timeout=TIMEOUT_S,
    )
    assert_error(resp, 413, "exceeds")


def test_an_endless_header_is_a_431(server, still_serves):
    resp = requests.get(server.url + "/health", headers={**server.headers(), "X-Big": "a" * 2**20}, timeout=TIMEOUT_S)
    assert_error(resp, 431, "headers")


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_the_context(server, still_serves, stream):
    body = {"input_ids": [504] * (CONTEXT + 100), "sampling_params": {"max_new_tokens": 2}, "stream": stream}
    assert_error(post(server, "/generate", body), 400)


def test_text_prompt_longer_than_the_context(server, still_serves):
    assert_error(post(server, "/generate", {"text": "hello " * (CONTEXT + 100), "max_tokens": 2}), 400)


@pytest.mark.parametrize("bad_id", [49152, 10**6])
def test_token_ids_outside_the_vocabulary(server, still_serves, bad_id):
    assert_error(post(server, "/generate", {"input_ids": [504, bad_id], "max_tokens": 2}), 400, str(bad_id))
    assert_error(post(server, "/v1/completions", {"prompt": [504, bad_id], "max_tokens": 2}), 400, str(bad_id))


def test_stop_token_ids_outside_the_vocabulary_stop_nothing(server, still_serves):
    """As SGLang, whose test kits send 119690 to every model: no token has the id, so none stops."""
    plain = post(server, "/generate", sampling(temperature=0, max_new_tokens=6)).json()
    for params in ({"stop_token_ids": [119690]}, {"stop_token_ids": [10**6, 119690], "min_new_tokens": 2}):
        resp = post(server, "/generate", sampling(temperature=0, max_new_tokens=6, **params))
        assert resp.status_code == 200 and resp.json()["output_ids"] == plain["output_ids"], resp.text


def test_unknown_path_and_wrong_method(server):
    missing = requests.post(server.url + "/v1/nothing", json={}, headers=server.headers(), timeout=TIMEOUT_S)
    assert_error(missing, 404, "POST /v1/nothing: no such endpoint on this server")
    # SGLang's and vLLM's endpoints of other kinds of models say why they are not here
    embeddings = requests.post(server.url + "/v1/embeddings", json={}, headers=server.headers(), timeout=TIMEOUT_S)
    assert_error(embeddings, 404, "POST /v1/embeddings: the served model generates text: embeddings, scores")
    ollama = requests.post(server.url + "/api/chat", json={}, headers=server.headers(), timeout=TIMEOUT_S)
    assert_error(ollama, 404, "POST /api/chat: Ollama's API is not served here")
    wrong = requests.get(server.url + "/generate", headers=server.headers(), timeout=TIMEOUT_S)
    assert_error(wrong, 405, "GET /generate: not allowed; this endpoint takes POST, PUT")


def test_duplicate_request_ids(server, still_serves):
    body = {"text": [TEXT, TEXT], "rid": ["same", "same"], "max_tokens": 2}
    assert_error(post(server, "/generate", body), 400, "distinct")


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/generate", b'{"text": "Hello \\ud800 there", "max_tokens": 2}', "text"),
        ("/generate", b'{"text": "hi", "sampling_params": {"stop": ["\\udfff"]}}', "sampling_params.stop.0"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages.0.content"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server, still_serves, path, body, field):
    resp = requests.post(
        server.url + path,
        data=body,
        headers={**server.headers(), "Content-Type": "application/json"},
        timeout=TIMEOUT_S,
    )
    message = assert_error(resp, 400, "unicode")
    assert message.startswith(field + ":")


def test_earlier_tool_call_arguments_escaping_a_lone_surrogate_reach_the_template_as_written(server, still_serves):
    """The arguments are JSON text whose escape spells \\ud800: valid JSON, no UTF-8 text once
    parsed, so the template gets the text (it was a 500 when the parsed value went on the wire)."""
    arguments = json.dumps({"a": "\ud800"})
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}]
    resp = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "path, body",
    [
        ("/generate", b'{"text": "hi", "sampling_params": {"temperature": Infinity}}'),
        ("/generate", b'{"text": "hi", "sampling_params": {"temperature": NaN}}'),
        ("/generate", b'{"text": "hi", "sampling_params": {"temperature": 1e999}}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}'),
        ("/v1/completions", b'{"prompt": "hi", "temperature": Infinity}'),
    ],
)
def test_json_infinity_and_nan_are_refused(server, still_serves, path, body):
    """JSON's parser admits Infinity, NaN and overflowing numbers; no field takes them."""
    resp = requests.post(
        server.url + path,
        data=body,
        headers={**server.headers(), "Content-Type": "application/json"},
        timeout=TIMEOUT_S,
    )
    assert_error(resp, 400, "temperature", "finite")
