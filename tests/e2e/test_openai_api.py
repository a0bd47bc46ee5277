"""The OpenAI-compatible API through the official `openai` SDK against a real `radixcluster up`:
chat and text completions, streaming (exact under load too), usage with cached tokens, logprobs,
structured output."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import openai
import pytest
import requests

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a meticulous assistant for a travel agency. Answer briefly and precisely. " * 10


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def assert_usage(usage, max_completion: int) -> None:
    assert usage.prompt_tokens > 0
    assert 0 <= usage.completion_tokens <= max_completion
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert 0 <= usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_models_lists_the_served_model(client, model):
    assert [m.id for m in client.models.list().data] == [model]


def test_chat_completion(client, model):
    resp = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion" and resp.model == model
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert_usage(resp.usage, 8)


def test_repeated_long_chat_reports_cached_tokens(client, model):
    messages = [{"role": "system", "content": SYSTEM}, *QUESTION]
    first = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=4, temperature=0)
    second = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=4, temperature=0)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert_usage(second.usage, 4)


def test_chat_streaming_matches_the_whole_answer(client, model):
    whole = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=QUESTION,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    entries = resp.choices[0].logprobs.content
    assert len(entries) == resp.usage.completion_tokens
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)


def test_chat_json_schema_response_format(client, model):
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
        max_tokens=32,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}},
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert json.loads(choice.message.content)["answer"] in ("yes", "no")


def test_completion_from_text_and_token_ids(client, model):
    resp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert resp.id.startswith("cmpl-") and resp.object == "text_completion"
    assert resp.choices[0].text and resp.choices[0].finish_reason in ("stop", "length")
    assert_usage(resp.usage, 8)
    ids = client.completions.create(model=model, prompt=[504, 3458, 282, 4649], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 4


def test_completion_default_max_tokens_is_16(client, model):
    resp = client.completions.create(
        model=model, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.usage.completion_tokens == 16 and resp.choices[0].finish_reason == "length"


def test_completion_batch_with_n_orders_choices_prompt_major(client, model):
    prompts = ["The capital of France is", "One, two, three, four,"]
    resp = client.completions.create(model=model, prompt=prompts, n=2, max_tokens=4, temperature=0)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    singles = [
        client.completions.create(model=model, prompt=p, max_tokens=4, temperature=0).choices[0].text for p in prompts
    ]
    assert [c.text for c in resp.choices] == [singles[0], singles[0], singles[1], singles[1]]


def test_logit_bias_bans_the_greedy_token_and_forces_another(server, client, model):
    prompt = "The capital of France is"

    def output_ids(**params) -> list[int]:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 3, "temperature": 0, **params}}
        resp = requests.post(server.url + "/generate", json=body, headers=server.headers(), timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.json()["output_ids"]

    plain = output_ids()
    assert output_ids(logit_bias={str(plain[0]): -100})[0] != plain[0]
    assert output_ids(logit_bias={"504": 100}) == [504, 504, 504]
    # the same through the OpenAI SDK, whose logit_bias maps token ids to biases in [-100, 100]
    banned = client.completions.create(
        model=model, prompt=prompt, max_tokens=3, temperature=0, logit_bias={str(plain[0]): -100}
    )
    unbiased = client.completions.create(model=model, prompt=prompt, max_tokens=3, temperature=0)
    assert banned.choices[0].text != unbiased.choices[0].text


def test_completion_logprobs(client, model):
    resp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == resp.usage.completion_tokens
    assert all(len(top) == 3 for top in lp.top_logprobs)


def test_completion_streaming_matches_the_whole_text(client, model):
    whole = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    chunks = list(
        client.completions.create(
            model=model,
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_sdk_raises_bad_request_for_invalid_parameters(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, temperature=-1)
    assert "temperature" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="hi", max_tokens=4, echo=True)
    assert client.completions.create(model=model, prompt="hi", max_tokens=2, temperature=0).choices


def test_concurrent_streams_under_a_loaded_api_equal_their_answers(server, client, model):
    """Deltas of many streams at once, read slowly while other clients keep the api's event loop
    busy (so outputs pile up before the response sends them), concatenate to the non-streaming
    answers, with one finish_reason per choice."""
    questions = [
        [{"role": "user", "content": f"Name {k} animals that start with the letter {'BCDFGHJKLM'[k]}."}]
        for k in range(8)
    ]
    answers = [
        [
            c.message.content
            for c in client.chat.completions.create(model=model, messages=q, max_tokens=12, temperature=0, n=2).choices
        ]
        for q in questions
    ]
    stop_load = threading.Event()

    def load() -> None:  # cumulative native streams with logprobs: heavy JSON on the api's loop
        body = {"text": "Load.", "return_logprob": True, "top_logprobs_num": 20, "stream": True,
                "sampling_params": {"max_new_tokens": 24, "ignore_eos": True}}  # fmt: skip
        while not stop_load.is_set():
            with requests.post(
                server.url + "/generate", json=body, headers=server.headers(), stream=True, timeout=120
            ) as r:
                for _ in r.iter_lines():
                    pass

    def slow_stream(question) -> tuple[list[str], list[list[str]]]:
        body = {"model": model, "messages": question, "max_tokens": 12, "temperature": 0, "n": 2, "stream": True}
        texts, finishes = ["", ""], [[], []]
        with requests.post(
            server.url + "/v1/chat/completions", json=body, headers=server.headers(), stream=True, timeout=120
        ) as r:
            for line in r.iter_lines(chunk_size=16):
                time.sleep(0.01)
                if line.startswith(b"data: {"):
                    choice = json.loads(line[len(b"data: ") :])["choices"][0]
                    texts[choice["index"]] += choice["delta"].get("content") or ""
                    if choice["finish_reason"]:
                        finishes[choice["index"]].append(choice["finish_reason"])
        return texts, finishes

    loaders = [threading.Thread(target=load) for _ in range(2)]
    for t in loaders:
        t.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            streamed = list(pool.map(slow_stream, questions))
    finally:
        stop_load.set()
        for t in loaders:
            t.join()
    for (texts, finishes), answer in zip(streamed, answers):
        assert texts == answer
        assert all(len(f) == 1 for f in finishes)
