"""Prompts too long for what they ask, truncated as the peers truncate them, over HTTP on real
servers: vLLM's per-request truncate_prompt_tokens keeps a prompt's last tokens, and SGLang's
--allow-auto-truncate keeps the beginning of a prompt over the context and lowers an output limit
over the room, where both are 400s by default. Each answer equals the one to the truncated prompt
sent as token ids."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.api_helpers import GREEDY, assert_error, generate, post
from support.servers import ServerHandle, launch_server

pytestmark = pytest.mark.slow

CONTEXT = 128
LONG_TEXT = "Radix trees share the prefixes of the prompts they hold. " * 30  # ~330 tokens


@pytest.fixture(scope="module")
def truncating() -> Iterator[ServerHandle]:
    with launch_server("--context-length", str(CONTEXT), "--allow-auto-truncate") as handle:
        yield handle


def prompt_ids(server: ServerHandle, text: str) -> list[int]:
    return post(server, "/tokenize", {"prompt": text}).json()["tokens"]


def test_truncate_prompt_tokens_keeps_the_last_tokens(server):
    ids = prompt_ids(server, LONG_TEXT)
    body = {"model": "any", "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    cut = post(server, "/v1/completions", {**body, "prompt": LONG_TEXT, "truncate_prompt_tokens": 12}).json()
    tail = post(server, "/v1/completions", {**body, "prompt": ids[-12:]}).json()
    assert cut["usage"]["prompt_tokens"] == 12 and cut["choices"][0]["prompt_token_ids"] == ids[-12:]
    assert cut["choices"][0]["text"] == tail["choices"][0]["text"]
    chat = {"model": "any", "max_tokens": 4, "messages": [{"role": "user", "content": LONG_TEXT}]}
    assert (
        post(server, "/v1/chat/completions", {**chat, "truncate_prompt_tokens": 20}).json()["usage"]["prompt_tokens"]
        == 20
    )
    assert_error(post(server, "/v1/completions", {**body, "prompt": "hi", "truncate_prompt_tokens": 10**6}), 400)


def test_truncate_prompt_tokens_serves_token_ids_longer_than_the_context(server):
    # vLLM cuts a token-id prompt before checking it against the context (8,192 here)
    long_ids = (prompt_ids(server, LONG_TEXT) * 30)[:9000]
    body = {"model": "any", "max_tokens": 4, "temperature": 0, "return_token_ids": True, "truncate_prompt_tokens": 12}
    cut = post(server, "/v1/completions", {**body, "prompt": [long_ids, long_ids[:100]]}).json()
    assert [choice["prompt_token_ids"] for choice in cut["choices"]] == [long_ids[-12:], long_ids[88:100]]
    assert_error(post(server, "/v1/completions", {**body, "prompt": long_ids, "truncate_prompt_tokens": None}), 400)


def test_auto_truncation_keeps_the_beginning_and_lowers_the_limit(truncating):
    ids = prompt_ids(truncating, LONG_TEXT)
    assert len(ids) > CONTEXT
    answer = generate(truncating, LONG_TEXT, max_new_tokens=16, sampling_params={**GREEDY, "ignore_eos": True})
    meta = answer["meta_info"]
    # the first CONTEXT - 1 tokens, and the one token of room left
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (CONTEXT - 1, 1)
    head = post(
        truncating, "/generate", {"input_ids": ids[: CONTEXT - 1], "sampling_params": {**GREEDY, "max_new_tokens": 1}}
    ).json()
    assert answer["output_ids"] == head["output_ids"]
    # token ids too, as many as the schema lets a body hold (the context's length)
    whole = post(
        truncating, "/generate", {"input_ids": ids[:CONTEXT], "sampling_params": {**GREEDY, "max_new_tokens": 1}}
    )
    assert (
        whole.json()["meta_info"]["prompt_tokens"] == CONTEXT - 1 and whole.json()["output_ids"] == head["output_ids"]
    )
    # a prompt that fits keeps its tokens, and asks more than the room: lowered, not refused
    body = {"model": "any", "prompt": ids[:100], "max_tokens": 100, "temperature": 0, "ignore_eos": True}
    usage = post(truncating, "/v1/completions", body).json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (100, CONTEXT - 100)
