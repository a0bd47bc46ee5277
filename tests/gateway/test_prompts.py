"""PromptReader: the gateway's token ids are the router's (text, chat template, batches, n, a
warm's or a pin's prefix), its salts (a tenant's namespace) and limits are the router's, and a
bad body is refused as the replica would refuse it."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from pydantic import ValidationError

from radixcluster.gateway.prompts import CHAT, COMPLETIONS, MESSAGES, NATIVE, PIN, RESPONSES, WARM, PromptReader
from radixcluster.protocol import GenerateRequest, PromptTokens, SamplingParams
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.gateway_tokens import prompt_tokens
from radixcluster.router.api.native_schemas import GenerateIn, cache_namespace
from radixcluster.router.api.openai_schemas import ChatCompletionIn, CompletionIn
from radixcluster.router.request_intake import RequestIntake
from radixcluster.router.text.tokenizer import load_tokenizer
from support.tool_template import TOOL_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def reader(tokenizer) -> PromptReader:
    return PromptReader(tokenizer)


LIMIT = 16 * 2**20  # the replicas' body limit


def intake(tokenizer) -> RequestIntake:
    return RequestIntake(tokenizer, tokenizer.vocab_size, 8192, pool_tokens=8192)


def router_ids(tokenizer, **fields) -> list[int]:
    """The ids the router serves for a fresh prompt (no earlier answer in its memo)."""
    return intake(tokenizer).prompt(GenerateRequest(rid="x", sampling=SamplingParams(), **fields))[1].tolist()


def router_salt(tokenizer, tenant: str | None, cache_salt: str | None) -> str | None:
    """The salt the router caches a request of ``tenant`` under."""
    msg = GenerateRequest(rid="x", sampling=SamplingParams(), text="Hi", tenant=tenant, cache_salt=cache_salt)
    return intake(tokenizer).make_request(msg)[0].cache_salt


def test_a_tenants_prompts_are_salted_as_the_router_salts_them(reader, tokenizer) -> None:
    for tenant, salt in (("alpha", None), ("alpha", "s"), ("beta", "s"), (None, "s"), (None, None)):
        body = {"text": ["one", "two"], "cache_salt": salt}
        routed = reader.read(NATIVE, body, tenant)
        assert {p.salt for p in routed.prompts} == {router_salt(tokenizer, tenant, salt)}
        chat = reader.read(CHAT, {"messages": [{"role": "user", "content": "Hi"}], "cache_salt": salt}, tenant)
        assert chat.prompts[0].salt == router_salt(tokenizer, tenant, salt)
    alpha = reader.read(NATIVE, {"text": "x"}, "alpha").prompts[0].salt
    with pytest.raises(ApiError, match="cache_salt") as refused:  # no client names a tenant's namespace
        reader.read(NATIVE, {"text": "x", "cache_salt": alpha})
    assert refused.value.status == 400


def test_an_extra_key_namespaces_prompts_on_every_endpoint_as_the_api_does(reader) -> None:
    chat = [{"role": "user", "content": "Hi"}]
    expected = cache_namespace("s", "k")
    for kind, body in ((NATIVE, {"text": "Hi"}), (COMPLETIONS, {"prompt": "Hi"}), (CHAT, {"messages": chat})):
        routed = reader.read(kind, {**body, "cache_salt": "s", "extra_key": "k"})
        assert routed.prompts[0].salt == expected != reader.read(kind, {**body, "cache_salt": "s"}).prompts[0].salt


def test_a_warm_or_a_pin_is_read_as_the_generation_of_its_prefix(reader, tokenizer) -> None:
    text = "You are a careful assistant."
    warm = reader.read(WARM, {"text": text, "cache_salt": "s"}, "alpha")
    (p,) = warm.prompts
    assert p.ids.tolist() == router_ids(tokenizer, text=text) and p.match_limit == len(p.ids) - 1
    assert p.salt == router_salt(tokenizer, "alpha", "s") and not warm.stream
    pinned = reader.read(PIN, {"input_ids": [5, 6, 7], "ttl_s": 30})
    assert pinned.prompts[0].ids.tolist() == [5, 6, 7] and pinned.prompts[0].salt is None
    with pytest.raises(ValidationError, match="ttl_s"):
        reader.read(PIN, {"text": text})
    with pytest.raises(ValidationError, match="exactly one"):
        reader.read(WARM, {"text": text, "input_ids": [1]})


def test_texts_and_chats_tokenize_as_the_router_does(reader, tokenizer) -> None:
    texts = ["你是一个资深Python工程师，请回答：如何实现一个LRU缓存？", "The capital of France is"]
    native = reader.read(NATIVE, {"text": texts, "sampling_params": {"n": 2}, "cache_salt": "s"})
    assert [p.ids.tolist() for p in native.prompts] == [router_ids(tokenizer, text=t) for t in texts for _ in (0, 1)]
    assert {p.salt for p in native.prompts} == {"s"}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    chat = reader.read(CHAT, {"messages": messages, "n": 3, "stream": True})
    assert [p.ids.tolist() for p in chat.prompts] == [router_ids(tokenizer, messages=messages)] * 3
    assert chat.stream and chat.usage_stride == 3 and not chat.include_usage
    # a chat that continues its last (assistant's) message: the ids the router serves for it
    answered = [*messages, {"role": "assistant", "content": "Hello"}]
    (going_on,) = reader.read(CHAT, {"messages": answered, "continue_final_message": True}).prompts
    assert going_on.ids.tolist() == router_ids(tokenizer, messages=answered, continue_final_message=True)
    assert going_on.ids.tolist() != router_ids(tokenizer, messages=answered)
    completion = reader.read(COMPLETIONS, {"prompt": [[1, 2, 3], [4, 5]], "n": 2})
    assert [p.ids.tolist() for p in completion.prompts] == [[1, 2, 3], [1, 2, 3], [4, 5], [4, 5]]


def test_a_chats_tools_and_template_kwargs_reach_its_template_as_they_reach_the_routers(tokenizer) -> None:
    tool_tokenizer = dataclasses.replace(tokenizer, chat_template=TOOL_TEMPLATE)
    tools = [{"type": "function", "function": {"name": "now"}}]
    messages = [{"role": "user", "content": "What time is it?"}]
    kwargs = {"enable_thinking": False}
    body = {"messages": messages, "tools": tools, "tool_choice": "required", "chat_template_kwargs": kwargs}
    (prompt,) = PromptReader(tool_tokenizer).read(CHAT, body).prompts
    assert prompt.ids.tolist() == router_ids(
        tool_tokenizer, messages=messages, tools=tools, chat_template_kwargs=kwargs
    )
    assert prompt.ids.tolist() != router_ids(tool_tokenizer, messages=messages, tools=tools)
    assert prompt.ids.tolist() != router_ids(tool_tokenizer, messages=messages, chat_template_kwargs=kwargs)
    # a reasoning effort of "none" reaches the template as enable_thinking false, as vLLM passes it
    effort = {"messages": messages, "tools": tools, "tool_choice": "required", "reasoning_effort": "none"}
    (thinking_off,) = PromptReader(tool_tokenizer).read(CHAT, effort).prompts
    off = {"enable_thinking": False, "reasoning_effort": "none"}
    assert thinking_off.ids.tolist() == router_ids(
        tool_tokenizer, messages=messages, tools=tools, chat_template_kwargs=off
    )
    assert thinking_off.ids.tolist() == prompt.ids.tolist()
    # the Responses API's flat tools and function-call items, read as the same chat
    calls = [{"type": "function_call", "call_id": "c1", "name": "now", "arguments": "{}"}]
    thought = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]}
    answered = [*messages, thought, *calls, {"type": "function_call_output", "call_id": "c1", "output": "noon"}]
    flat = {"input": answered, "tools": [{"type": "function", "name": "now"}], "tool_choice": "required"}
    (response,) = PromptReader(tool_tokenizer).read(RESPONSES, flat).prompts
    chat = [
        *messages,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": {}}}],
            "reasoning_content": "Hm.",
        },
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]
    assert response.ids.tolist() == router_ids(tool_tokenizer, messages=chat, tools=tools)
    assert "<think>Hm.</think><tool_call>" in tool_tokenizer.decode(response.ids.tolist())
    # and Anthropic's Messages API: tool_use and tool_result blocks, thinking, a tool without input
    blocks = [
        *messages,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Hm.", "signature": ""},
                {"type": "tool_use", "id": "c1", "name": "now", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "noon"}]},
    ]
    anthropic = {"max_tokens": 4, "messages": blocks, "tools": [{"name": "now"}], "tool_choice": {"type": "any"}}
    (message,) = PromptReader(tool_tokenizer).read(MESSAGES, anthropic).prompts
    no_input = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}]
    assert message.ids.tolist() == router_ids(tool_tokenizer, messages=chat, tools=no_input)
    # the chat endpoint's earlier thinking, under vLLM's either name, reaches the template the same way
    for name in ("reasoning_content", "reasoning"):
        call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
        said = [*chat[:1], {"role": "assistant", "content": "", "tool_calls": [call], name: "Hm."}, *chat[2:]]
        (asked,) = PromptReader(tool_tokenizer).read(CHAT, {"messages": said, "tools": tools}).prompts
        assert asked.ids.tolist() == response.ids.tolist()


def replica_sees(kind: str, routed, body: dict) -> list[GenerateRequest]:
    """The GenerateRequests a replica's api makes of the body the gateway forwards."""
    forwarded = json.loads(routed.replica_body(json.dumps(body).encode(), LIMIT))
    if kind == NATIVE:
        return GenerateIn.model_validate(forwarded).expand()
    schema = CompletionIn if kind == COMPLETIONS else ChatCompletionIn
    parsed = schema.model_validate(forwarded)
    return [GenerateRequest(rid="x", sampling=SamplingParams(), tokens=prompt_tokens(parsed.gateway_tokens, 0))]


@pytest.mark.parametrize(
    "kind, body",
    [
        (NATIVE, {"text": ["你是一个资深Python工程师", "The capital of France is"], "sampling_params": {"n": 2}}),
        (COMPLETIONS, {"prompt": "Once upon a time", "n": 2}),
        (CHAT, {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]}),
    ],
)
def test_the_replica_is_handed_the_ids_and_serves_them_as_its_own(reader, tokenizer, kind, body) -> None:
    routed = reader.read(kind, body)
    seen = replica_sees(kind, routed, body)
    assert [m.tokens.tokenizer for m in seen] == [tokenizer.fingerprint] * len(seen)
    assert [m.tokens.ids.tolist() for m in seen] == [p.ids.tolist() for p in routed.prompts][: len(seen)]
    # the router takes them for its prompt; a text it has them for is not tokenized again
    text = {"text": "The capital of France is"} if kind != CHAT else {"messages": body["messages"]}
    msg = GenerateRequest(rid="x", sampling=SamplingParams(), tokens=seen[-1].tokens, **text)
    assert intake(tokenizer).prompt(msg)[1].tolist() == seen[-1].tokens.ids.tolist()


def test_ids_from_another_tokenizer_or_for_ids_prompts_are_not_taken(reader, tokenizer) -> None:
    body = {"text": "The capital of France is"}
    foreign = PromptTokens("another tokenizer", np.array([1, 2, 3], np.int32))
    msg = GenerateRequest(rid="x", sampling=SamplingParams(), tokens=foreign, **body)
    assert intake(tokenizer).prompt(msg)[1].tolist() == router_ids(tokenizer, **body)
    ids_only = {"input_ids": [[5, 6], [7, 8]]}
    assert reader.read(NATIVE, ids_only).gateway_tokens is None
    mixed = {"text": ["a", "b"], "input_ids": None}
    assert [m.tokens is not None for m in replica_sees(NATIVE, reader.read(NATIVE, mixed), mixed)] == [True, True]
    # a body the gateway cannot put the field into unchanged goes as it came
    routed = reader.read(NATIVE, body)
    raw = json.dumps(body).encode()
    utf16 = json.dumps(body).encode("utf-16-le")
    assert routed.replica_body(utf16, LIMIT) == utf16
    assert routed.replica_body(b" " + raw, LIMIT) == b" " + raw
    assert routed.replica_body(raw, len(raw) + 10) == raw  # it would not fit the replica's limit


def test_the_memo_of_answers_comes_before_the_gateways_ids(tokenizer) -> None:
    """The next turn of a chat keeps the ids the model generated (the gateway has no memo)."""
    router = intake(tokenizer)
    earlier = "An earlier prompt and the answer the model gave to it"
    router.memo.remember(earlier, np.array([9, 9, 9], np.int32))
    given = PromptTokens(tokenizer.fingerprint, np.array([1, 2, 3, 4], np.int32))
    msg = GenerateRequest(rid="x", sampling=SamplingParams(), text=earlier + " and a next turn", tokens=given)
    assert router.prompt(msg)[1].tolist()[:3] == [9, 9, 9]


def test_the_match_limit_is_all_but_the_last_token_and_not_past_the_first_logprob(reader) -> None:
    (plain,) = reader.read(NATIVE, {"input_ids": list(range(1, 50))}).prompts
    assert plain.match_limit == 48
    (scored,) = reader.read(
        NATIVE, {"input_ids": list(range(1, 50)), "return_logprob": True, "logprob_start_len": 20}
    ).prompts
    assert scored.match_limit == 20
    # a completion's echo with logprobs scores its whole prompt: nothing of it can be matched
    echoed = reader.read(COMPLETIONS, {"prompt": list(range(1, 50)), "echo": True, "logprobs": 0, "n": 2}).prompts
    assert [p.match_limit for p in echoed] == [0, 0]
    (echo_only,) = reader.read(COMPLETIONS, {"prompt": list(range(1, 50)), "echo": True}).prompts
    assert echo_only.match_limit == 48


@pytest.mark.parametrize(
    "kind, body, error",
    [
        (NATIVE, {"text": ""}, ValidationError),
        (NATIVE, {"text": "x", "sampling_params": {"temprature": 1}}, ValidationError),
        (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, ValidationError),
    ],
)
def test_bad_bodies_are_refused_before_any_replica_sees_them(reader, kind, body, error) -> None:
    with pytest.raises(error):
        reader.read(kind, body)


def test_lists_longer_than_the_models_context_are_refused_before_they_are_read(tokenizer) -> None:
    reader = PromptReader(tokenizer, context_length=4)
    with pytest.raises(ValidationError, match="5 items; this model's context of 4 tokens"):
        reader.read(CHAT, {"messages": [{"role": "user", "content": "a"}] * 5})
    with pytest.raises(ValidationError, match="5 token ids"):
        reader.read(COMPLETIONS, {"prompt": [1, 2, 3, 4, 5]})
    assert len(reader.read(CHAT, {"messages": [{"role": "user", "content": "a"}] * 4}).prompts) == 1
