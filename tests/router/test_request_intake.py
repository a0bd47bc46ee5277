"""The router's own checks on a GenerateRequest, for messages that did not come through the api's
schemas (any client of the router's socket): with the real SmolLM2 tokenizer."""

from __future__ import annotations

import dataclasses

import pytest

from radixcluster.protocol import GenerateRequest, PromptPin, SamplingParams
from radixcluster.router.request_intake import RequestIntake, RequestRejected
from radixcluster.router.text.tokenizer import load_tokenizer
from support.tool_template import TOOL_TEMPLATE

VOCAB = 49152  # SmolLM2's logits


@pytest.fixture(scope="module")
def intake(model_path) -> RequestIntake:
    return RequestIntake(load_tokenizer(model_path), VOCAB, context_length=8192, pool_tokens=100_000)


def generate(**sampling) -> GenerateRequest:
    return GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=4, **sampling), input_ids=[504, 3458])


def test_a_logit_bias_becomes_the_requests_bias_rows(intake: RequestIntake) -> None:
    request, _ = intake.make_request(generate(logit_bias={28: 5.0, 0: -100.0}))
    assert request.bias_ids.tolist() == [28, 0] and request.bias_values.tolist() == [5.0, -100.0]
    plain, _ = intake.make_request(generate())
    assert plain.bias_ids.size == 0


@pytest.mark.parametrize(
    "bias, why",
    [
        ({VOCAB: 1.0}, "outside the vocabulary"),
        ({-1: 1.0}, "outside the vocabulary"),
        ({2**70: 1.0}, "no token id"),
        ({28: float("nan")}, "finite numbers"),
        ({28: float("inf")}, "finite numbers"),
        ({28: "high"}, "finite numbers"),
    ],
)
def test_a_logit_bias_the_api_would_refuse_is_refused_here_too(intake: RequestIntake, bias: dict, why: str) -> None:
    with pytest.raises(RequestRejected, match=why):
        intake.make_request(generate(logit_bias=bias))


def test_a_default_limit_gives_way_to_the_room_the_prompt_leaves(model_path) -> None:
    intake = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=8192, pool_tokens=8000)
    long_prompt = [504] * 7900

    def request(max_new_tokens: int, is_default: bool) -> GenerateRequest:
        sampling = SamplingParams(max_new_tokens=max_new_tokens, max_new_tokens_is_default=is_default)
        return GenerateRequest(rid="r", sampling=sampling, input_ids=long_prompt)

    # the pool (8,000 tokens) is the tighter bound here: 100 new tokens fit after the prompt
    request_, _ = intake.make_request(request(512, is_default=True))
    assert request_.sampling.max_new_tokens == 100
    short, _ = intake.make_request(generate(max_new_tokens_is_default=True))
    assert short.sampling.max_new_tokens == 4  # room enough: the default stands
    with pytest.raises(RequestRejected, match=r"\+ max_new_tokens \(512\)"):
        intake.make_request(request(512, is_default=False))  # a limit the client set is refused as before


@pytest.mark.parametrize(
    "sampling, why",
    [
        ({"temperature": -1.0}, r"temperature must be within \[0, 3.40282e\+38\], got -1.0"),
        ({"temperature": float("nan")}, "temperature must be within"),
        ({"temperature": 1e39}, "temperature must be within"),
        ({"top_p": 0.0}, r"top_p must be within \(0, 1\]"),
        ({"min_p": 1.5}, "min_p must be within"),
        ({"frequency_penalty": -3.0}, "frequency_penalty must be within"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be within"),
    ],
)
def test_sampling_floats_the_api_would_refuse_are_refused_here_too(intake: RequestIntake, sampling, why) -> None:
    with pytest.raises(RequestRejected, match=why):
        intake.make_request(generate(**sampling))


def test_a_pinned_message_of_a_chat_with_tools_is_a_prefix_of_its_prompt(model_path) -> None:
    """The pin's prefix is rendered with the chat's tools, as the prompt is (a template that
    writes them first would otherwise pin ids the prompt does not start with)."""
    tokenizer = dataclasses.replace(load_tokenizer(model_path), chat_template=TOOL_TEMPLATE)
    intake = RequestIntake(tokenizer, VOCAB, context_length=8192, pool_tokens=100_000)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What time is it?"}]
    tools = [{"type": "function", "function": {"name": "now"}}]
    msg = GenerateRequest(
        rid="r", sampling=SamplingParams(max_new_tokens=4), messages=messages, tools=tools, pins=[PromptPin(60.0, 1)]
    )
    request, text = intake.make_request(msg)
    ((pinned, ttl),) = request.pins
    assert text.startswith("<|im_start|>system\nTools:\n") and ttl == 60.0
    assert 0 < pinned.size < request.prompt_ids.size
    assert request.prompt_ids[: pinned.size].tolist() == pinned.tolist()


def test_a_chat_of_more_messages_than_the_context_has_tokens_is_refused_before_rendering(model_path) -> None:
    intake = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=64, pool_tokens=100_000)
    chat = [{"role": "user", "content": "a"}] * 65
    msg = GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=1), messages=chat)
    with pytest.raises(RequestRejected, match="the chat has 65 messages; this model's context of 64 tokens"):
        intake.make_request(msg)
    intake.check_chat(chat[:64])  # as many as it has tokens: left to the rendered prompt's own checks


def truncating(keep: int | None, ids: list[int], **fields) -> GenerateRequest:
    return GenerateRequest(
        rid="r", sampling=SamplingParams(max_new_tokens=4), input_ids=ids, truncate_prompt_tokens=keep, **fields
    )


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(model_path) -> None:
    intake = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=64, pool_tokens=1000)
    ids = list(range(100, 200))
    assert intake.make_request(truncating(10, ids))[0].prompt_ids.tolist() == ids[-10:]
    assert intake.make_request(truncating(30, ids[:5]))[0].prompt_ids.tolist() == ids[:5]  # shorter: whole
    # -1 keeps what the context holds, which leaves no room for an answer
    with pytest.raises(RequestRejected, match="prompt is too long: 64 tokens > 63 maximum"):
        intake.make_request(truncating(-1, ids))
    for keep, why in ((65, "at most this model's context length of 64, got 65"), (-2, "got -2"), (0, "empty")):
        with pytest.raises(RequestRejected, match=why):
            intake.make_request(truncating(keep, ids))


def test_a_truncated_text_prompt_leaves_nothing_for_the_memo(intake: RequestIntake) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 4
    request = GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=4), text=text, truncate_prompt_tokens=5)
    truncated, memo_text = intake.make_request(request)
    whole, whole_text = intake.make_request(dataclasses.replace(request, truncate_prompt_tokens=None))
    assert truncated.prompt_ids.tolist() == whole.prompt_ids[-5:].tolist()
    assert (memo_text, whole_text) == (None, text)


def test_truncating_a_chat_pinned_from_its_start_is_refused(intake: RequestIntake) -> None:
    chat = [{"role": "user", "content": "Hello there, how are you today?"}]
    pinned = GenerateRequest(
        rid="r", sampling=SamplingParams(max_new_tokens=4), messages=chat, pins=[PromptPin(60.0, 1)]
    )
    with pytest.raises(RequestRejected, match="cache_control pins"):
        intake.make_request(dataclasses.replace(pinned, truncate_prompt_tokens=3))
    # a limit the chat fits in cuts nothing
    assert intake.make_request(dataclasses.replace(pinned, truncate_prompt_tokens=1000))[0].pins


def test_auto_truncation_keeps_the_prompts_beginning_and_lowers_the_limit(model_path, caplog) -> None:
    intake = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=64, pool_tokens=1000, auto_truncate=True)
    ids = list(range(100, 200))
    request = GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=32), input_ids=ids)
    with caplog.at_level("WARNING"):
        truncated, _ = intake.make_request(request)
    assert truncated.prompt_ids.tolist() == ids[:63] and truncated.sampling.max_new_tokens == 1
    assert "a prompt of 100 tokens leaves no room (this model's context length is 64" in caplog.text
    # a prompt that fits keeps its tokens; its limit is lowered to the room, not refused
    fitting, _ = intake.make_request(dataclasses.replace(request, input_ids=ids[:40]))
    assert fitting.prompt_ids.tolist() == ids[:40] and fitting.sampling.max_new_tokens == 24
    # without the flag the same requests are refused
    strict = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=64, pool_tokens=1000)
    for ids_ in (ids, ids[:40]):
        with pytest.raises(RequestRejected):
            strict.make_request(dataclasses.replace(request, input_ids=ids_))


def test_a_pool_smaller_than_the_context_bounds_prompts_as_the_context_would(model_path) -> None:
    """As SGLang caps prompts by both: a prompt the pool cannot hold is "too long" (the words
    Claude Code reads to compact), not a limit to lower; auto-truncation cuts it to the pool."""
    ids = list(range(100, 200))
    small = RequestIntake(load_tokenizer(model_path), VOCAB, context_length=2048, pool_tokens=64)
    request = GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=16), input_ids=ids)
    with pytest.raises(
        RequestRejected, match=r"prompt is too long: 100 tokens > 63 maximum \(.*KV pool holds 64"
    ) as refused:
        small.make_request(request)
    assert refused.value.param is None
    truncating = RequestIntake(load_tokenizer(model_path), VOCAB, 2048, pool_tokens=64, auto_truncate=True)
    cut, _ = truncating.make_request(request)
    assert cut.prompt_ids.tolist() == ids[:63] and cut.sampling.max_new_tokens == 1


def test_the_memos_ids_are_used_only_where_the_encoder_cuts_the_text_too(model_path) -> None:
    """A prompt that extends a remembered prompt + answer reuses its ids up to there, unless the
    text goes on inside the last piece: "mountain" + "s" is encoded whole, as with no memo."""
    tokenizer = load_tokenizer(model_path)
    intake = RequestIntake(tokenizer, VOCAB, context_length=8192, pool_tokens=100_000)
    remembered = "Once upon a time there was a small town between two mountain"
    generated = tokenizer.encode(remembered[:-4]) + tokenizer.encode("tain", add_special_tokens=False)
    intake.memo.remember(remembered, generated)

    def ids(text: str) -> list[int]:
        request, _ = intake.make_request(GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=1), text=text))
        return request.prompt_ids.tolist()

    assert ids(remembered + " and a river") == generated + tokenizer.encode(" and a river", add_special_tokens=False)
    assert ids(remembered + "s and a river") == tokenizer.encode(remembered + "s and a river")
    assert ids(remembered + "<|im_end|>") == generated + tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert tokenizer.splits_at("a.<|im_end|>", 2) and not tokenizer.splits_at("mountains", 8)


def test_a_limit_past_the_context_is_refused_in_the_clients_name_of_it(intake: RequestIntake) -> None:
    for name in ("max_new_tokens", "max_tokens", "max_output_tokens"):
        sampling = SamplingParams(max_new_tokens=9000, max_new_tokens_name=name)
        with pytest.raises(RequestRejected, match=rf"\+ {name} \(9000\) = 9002 tokens exceed .* lower {name} or"):
            intake.make_request(GenerateRequest(rid="r", sampling=sampling, input_ids=[504, 3458]))
