"""The api's bounds on every field: each bad request is refused with a message that names the field,
before anything reaches the router (no server needed: these are the schemas and the body parser)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from radixcluster.protocol import PromptPin
from radixcluster.router.api.control_schemas import ProfileIn
from radixcluster.router.api.errors import ApiError, describe_validation_error, parse_json
from radixcluster.router.api.messages_schemas import MessagesIn
from radixcluster.router.api.native_schemas import (
    MAX_GENERATIONS,
    MAX_GRAMMAR_CHARS,
    MAX_KEY_CHARS,
    MAX_STOP_CHARS,
    MAX_STOP_REGEXES,
    MAX_STOP_STRINGS,
    GenerateIn,
    SamplingParamsIn,
)
from radixcluster.router.api.openai_schemas import JSON_OBJECT_SCHEMA, ChatCompletionIn, CompletionIn
from radixcluster.router.api.responses_schemas import ResponsesIn

BIG = 2**63
CHAT = [{"role": "user", "content": "hi"}]


def refusal(model: type, body: dict) -> str:
    """The 400 message the api would send for ``body``."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body).sampling() if model is not GenerateIn else model.model_validate(body).expand()
    return describe_validation_error(info.value)


def sampling(**params) -> dict:
    return {"text": "hi", "sampling_params": params}


NATIVE = {
    "token id beyond int32": ({"input_ids": [1, 2**64 - 1]}, "input_ids.1"),
    "stop token id beyond int32": (sampling(stop_token_ids=[BIG]), "stop_token_ids"),
    "seed beyond int64": (sampling(seed=BIG), "seed"),
    "top_k beyond int32": (sampling(top_k=BIG), "top_k"),
    "max_new_tokens beyond int32": (sampling(max_new_tokens=BIG), "max_new_tokens"),
    "top-level max_tokens beyond int32": ({"text": "hi", "max_tokens": BIG}, "max_tokens"),
    "logprob_start_len beyond int32": ({"text": "hi", "logprob_start_len": BIG}, "logprob_start_len"),
    "infinite temperature": (sampling(temperature=float("inf")), "temperature"),
    "temperature beyond float32": (sampling(temperature=1e39), "temperature"),
    "NaN top_p": (sampling(top_p=float("nan")), "top_p"),
    "too many stop strings": (sampling(stop=["x"] * (MAX_STOP_STRINGS + 1)), "stop"),
    "a 200,000-character stop string": (sampling(stop="x" * 200_000), "stop"),
    "too many stop token ids": (sampling(stop_token_ids=[1] * 10_000), "stop_token_ids"),
    "a huge regex": (sampling(regex="a" * (MAX_GRAMMAR_CHARS + 1)), "regex"),
    "a huge JSON schema object": (sampling(json_schema={"enum": ["x" * MAX_GRAMMAR_CHARS]}), "json_schema"),
    "fan-out": ({"text": ["hi"] * 20_000, "sampling_params": {"n": 64}}, "generations"),
    "deadline of zero": ({"text": "hi", "deadline_s": 0}, "deadline_s"),
    "infinite deadline": ({"text": "hi", "deadline_s": float("inf")}, "deadline_s"),
    # a gateway's ids of the prompts: whole int32s in base64, one entry per prompt
    "gateway ids not base64": ({"text": "hi", "gateway_tokens": {"tokenizer": "f", "prompts": ["*"]}}, "base64"),
    "gateway ids of 3 bytes": ({"text": "hi", "gateway_tokens": {"tokenizer": "f", "prompts": ["AQID"]}}, "int32"),
    "gateway ids for 2 prompts of 1": (
        {"text": "hi", "gateway_tokens": {"tokenizer": "f", "prompts": [None, None]}},
        "2 entries for 1 prompts",
    ),
    # SGLang's fields: each is bounded too
    "too many stop regexes": (sampling(stop_regex=["x"] * (MAX_STOP_REGEXES + 1)), "stop_regex"),
    "a 200,000-character stop regex": (sampling(stop_regex="x" * 200_000), "stop_regex"),
    "stream_interval beyond int32": (sampling(stream_interval=BIG), "stream_interval"),
    "per-prompt logprob_start_len beyond int32": (
        {"text": ["hi", "ho"], "logprob_start_len": [0, BIG]},
        "logprob_start_len.1",
    ),
    "a long rid": ({"text": "hi", "rid": "r" * (MAX_KEY_CHARS + 1)}, "rid"),
    "a long cache_salt": ({"text": "hi", "cache_salt": "s" * 200_000}, "cache_salt"),
    "a long extra_key in a batch": ({"text": ["hi", "ho"], "extra_key": ["k", "k" * 200_000]}, "extra_key.1"),
}

OPENAI = {
    "completion prompt id beyond int32": (CompletionIn, {"prompt": [1, BIG]}, "prompt"),
    "completion seed beyond int64": (CompletionIn, {"prompt": "hi", "seed": 2**64 - 1}, "seed"),
    "completion top_k beyond int32": (CompletionIn, {"prompt": "hi", "top_k": BIG}, "top_k"),
    "completion fan-out": (CompletionIn, {"prompt": ["hi"] * 20_000, "n": 64}, "generations"),
    "a user message without content": (ChatCompletionIn, {"messages": [{"role": "user"}]}, "needs content"),
    "completion infinite temperature": (CompletionIn, {"prompt": "hi", "temperature": float("inf")}, "temperature"),
    "completion temperature beyond float32": (CompletionIn, {"prompt": "hi", "temperature": 1e39}, "temperature"),
    "chat max_tokens beyond int32": (ChatCompletionIn, {"messages": CHAT, "max_tokens": BIG}, "max_tokens:"),
    "chat stop bomb": (ChatCompletionIn, {"messages": CHAT, "stop": ["x" * (MAX_STOP_CHARS + 1)]}, "stop"),
    "chat stop token bomb": (ChatCompletionIn, {"messages": CHAT, "stop_token_ids": [BIG]}, "stop_token_ids"),
    "chat deadline": (ChatCompletionIn, {"messages": CHAT, "deadline_s": -1}, "deadline_s"),
    "chat long rid": (ChatCompletionIn, {"messages": CHAT, "rid": "r" * (MAX_KEY_CHARS + 1)}, "rid"),
    "completion long cache_salt": (CompletionIn, {"prompt": "hi", "cache_salt": "s" * 200_000}, "cache_salt"),
    "chat cache_control ttl over a week": (
        ChatCompletionIn,
        {"messages": CHAT, "cache_control": {"ttl": "169h"}},
        "ttl",
    ),
    "completion cache_control ttl of zero": (CompletionIn, {"prompt": "hi", "cache_control": {"ttl": 0}}, "ttl"),
    "chat cache_control ttl unreadable": (
        ChatCompletionIn,
        {"messages": [{"role": "user", "content": "hi", "cache_control": {"ttl": "5 minutes"}}]},
        "ttl",
    ),
    "chat cache_control of another type": (
        ChatCompletionIn,
        {"messages": CHAT, "cache_control": {"type": "persistent"}},
        "cache_control.type",
    ),
    "chat cache_control with a typo": (ChatCompletionIn, {"messages": CHAT, "cache_control": {"tll": 5}}, "tll"),
    "chat response_format bomb": (
        ChatCompletionIn,
        {
            "messages": CHAT,
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["x" * MAX_GRAMMAR_CHARS]}}},
        },
        "json_schema",
    ),
    "completion logit_bias keyed by a float": (CompletionIn, {"prompt": "hi", "logit_bias": {"12.0": 5}}, "integers"),
    # OpenAI's range, and vLLM's (SGLang's /generate takes any), and Anthropic's
    "chat temperature over 2": (ChatCompletionIn, {"messages": CHAT, "temperature": 2.5}, "temperature"),
    "responses temperature over 2": (ResponsesIn, {"input": "hi", "temperature": 5}, "temperature"),
    "messages temperature over 1": (MessagesIn, {"messages": CHAT, "max_tokens": 4, "temperature": 1.5}, "temperature"),
    "gateway ids for 2 prompts of a chat": (
        ChatCompletionIn,
        {"messages": CHAT, "gateway_tokens": {"tokenizer": "f", "prompts": ["AQAAAA==", None]}},
        "2 entries for 1 prompts",
    ),
}


@pytest.mark.parametrize("body, field", NATIVE.values(), ids=NATIVE.keys())
def test_native_bounds_name_the_field(body: dict, field: str) -> None:
    assert field in refusal(GenerateIn, body)


@pytest.mark.parametrize("model, body, field", OPENAI.values(), ids=OPENAI.keys())
def test_openai_bounds_name_the_field(model: type, body: dict, field: str) -> None:
    assert field in refusal(model, body)


def test_only_an_assistants_message_may_come_without_content() -> None:
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}, {"role": "user", "content": ""}]
    body = ChatCompletionIn.model_validate({"messages": chat})
    assert [m.as_dict()["content"] for m in body.messages] == ["hi", "", ""]


def test_text_parts_are_read_one_per_line_as_vllm_and_tokenize_read_them() -> None:
    parts = [{"type": "text", "text": "Name three"}, {"type": "text", "text": "prime numbers."}]
    body = ChatCompletionIn.model_validate({"messages": [{"role": "user", "content": parts}]})
    assert body.messages[0].as_dict()["content"] == "Name three\nprime numbers."
    # an assistant's refusal part (the OpenAI SDK's types) is its text, as vLLM reads it
    said = [{"type": "refusal", "refusal": "I cannot."}, {"type": "text", "text": "Ask me another."}]
    body = ChatCompletionIn.model_validate({"messages": [{"role": "assistant", "content": said}]})
    assert body.messages[0].as_dict()["content"] == "I cannot.\nAsk me another."
    for part, word in (({"type": "refusal"}, "a refusal part needs its refusal"), ({"type": "text"}, "its text")):
        assert word in refusal(ChatCompletionIn, {"messages": [{"role": "assistant", "content": [part]}]})


@pytest.mark.parametrize(
    "model, body",
    [
        (ChatCompletionIn, {"messages": [{"role": "user", "content": "a"}] * 3}),
        (ChatCompletionIn, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 3}]}),
        (ResponsesIn, {"input": [{"role": "user", "content": "a"}] * 3}),
        (ResponsesIn, {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 3}]}),
        (CompletionIn, {"prompt": [1, 2, 3]}),
        (CompletionIn, {"prompt": [[1], [1, 2, 3]]}),
        (GenerateIn, {"input_ids": [1, 2, 3]}),
    ],
)
def test_lists_longer_than_the_context_has_tokens_are_refused_before_they_are_read(model: type, body: dict) -> None:
    """Messages, content parts, token ids: each takes a token at least."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body, context={"context_length": 2})
    message = describe_validation_error(info.value)
    assert message.endswith("this model's context of 2 tokens holds fewer (each takes a token at least)")
    assert ": 3 items;" in message or ": 3 token ids;" in message
    model.model_validate(body, context={"context_length": 3})
    model.model_validate(body)  # no context given (the gateway's reading): not counted


def test_a_batch_of_more_prompts_than_one_request_may_generate_from_is_refused_at_once() -> None:
    with pytest.raises(ValidationError, match="257 prompts; at most 256 generations per request"):
        GenerateIn.model_validate({"input_ids": [[1]] * 257})
    with pytest.raises(ValidationError, match="257 prompts"):
        CompletionIn.model_validate({"prompt": ["a"] * 257})


def test_the_limits_themselves_are_accepted() -> None:
    body = GenerateIn.model_validate(
        {
            "text": ["hi"] * (MAX_GENERATIONS // 4),
            "sampling_params": {
                "n": 4,
                "stop": ["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
                "stop_regex": ["x" * MAX_STOP_CHARS] * MAX_STOP_REGEXES,
                "regex": "a" * MAX_GRAMMAR_CHARS,
                "seed": BIG - 1,
                "top_k": 2**31 - 1,
            },
            "deadline_s": 3600,
            "rid": [f"{i:0{MAX_KEY_CHARS}}" for i in range(MAX_GENERATIONS // 4)],
            "cache_salt": "s" * MAX_KEY_CHARS,
        }
    )
    assert len(body.expand()) == MAX_GENERATIONS
    assert CompletionIn.model_validate({"prompt": "hi", "seed": -(2**63)}).sampling().seed == -(2**63)
    assert CompletionIn.model_validate({"prompt": "hi", "temperature": 2}).sampling().temperature == 2
    spaced = {" 12": 1.0, "013": -1.0}  # as vLLM's int() reads them
    assert CompletionIn.model_validate({"prompt": "hi", "logit_bias": spaced}).sampling().logit_bias == {
        12: 1.0,
        13: -1.0,
    }
    assert GenerateIn.model_validate(sampling(temperature=5)).expand()[0].sampling.temperature == 5


def test_the_deprecated_function_call_messages_read_as_the_tool_call_shape() -> None:
    # OpenAI's SDK still types them, and vLLM takes them
    call = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "18"},
    ]
    assistant, answer = [m.as_dict() for m in ChatCompletionIn.model_validate({"messages": messages}).messages[1:]]
    assert assistant["tool_calls"] == [{"type": "function", "function": {**call, "arguments": {"city": "Oslo"}}}]
    assert answer == {"role": "function", "name": "get_weather", "content": "18"}


def test_union_member_names_stay_out_of_the_message() -> None:
    message = refusal(GenerateIn, {"input_ids": [1, BIG]})
    assert "constrained-int" not in message and "input_ids.1: Input should be less than or equal to" in message


def test_our_validators_speak_without_pydantics_prefix() -> None:
    assert refusal(CompletionIn, {"prompt": ""}) == "prompt must not be empty"
    assert refusal(GenerateIn, {"text": ["a", "b"], "sampling_params": [{}]}) == "1 sampling_params for 2 prompts"
    limit = "sampling_params.temperature: Input should be less than or equal to 3.40282e+38"
    assert refusal(GenerateIn, sampling(temperature=1e39)) == limit


@pytest.mark.parametrize(
    "model, body, message",
    [
        # the member whose shape the value has says what is wrong; the others' "should be a
        # valid list" (or string) is left out
        (
            GenerateIn,
            sampling(temperature=-1),
            "sampling_params.temperature: Input should be greater than or equal to 0",
        ),
        (GenerateIn, {"input_ids": [-1]}, "input_ids.0: Input should be greater than or equal to 0"),
        (
            GenerateIn,
            {"text": "hi", "sampling_params": [{"top_p": 3}]},
            "sampling_params.0.top_p: Input should be less than or equal to 1",
        ),
        (CompletionIn, {"prompt": [1, -2]}, "prompt.1: Input should be greater than or equal to 0"),
        # a value of no member's shape: each member's type, the bare tag "str" not in the path
        (GenerateIn, {"text": 5}, "text: Input should be a valid string; text: Input should be a valid list"),
    ],
)
def test_a_union_is_described_by_the_member_the_value_fits(model: type, body: dict, message: str) -> None:
    assert refusal(model, body) == message


@pytest.mark.parametrize(
    "body, where",
    [
        (b'{"text": "hi \\ud800"}', "text"),
        (b'{"text": ["ok", "\\udfff there"]}', "text.1"),
        (b'{"text": "hi", "sampling_params": {"stop": ["\\ud83d"]}}', "sampling_params.stop.0"),
        (b'{"messages": [{"role": "user", "content": "\\udc00"}]}', "messages.0.content"),
        (b'{"\\ud800": 1}', "\\ud800"),  # a key: named escaped, so the message is valid UTF-8
        (b'{"text": "\xed\xa0\x80"}', "text"),  # no escape: the surrogate's own UTF-8 bytes
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(body: bytes, where: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_json(body)
    assert info.value.status == 400
    assert info.value.message.startswith(where + ":")
    info.value.message.encode("utf-8")
    assert "unicode" in info.value.message


def test_paired_surrogates_and_deep_nesting() -> None:
    assert parse_json(b'{"text": "\\ud83d\\ude00"}') == {"text": "\U0001f600"}
    with pytest.raises(ApiError) as info:
        parse_json(b"[" * 100_000 + b"]" * 100_000)
    assert info.value.status == 400 and "nested" in info.value.message


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"tools": [{"maxLength": Infinity}]}', "tools.0.maxLength: Infinity is not a finite number"),
        (b'{"chat_template_kwargs": {"x": NaN}}', "chat_template_kwargs.x: NaN is not a finite number"),
        (b'{"x": -1e999}', "x: -1e999 is not a finite number"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "invalid JSON in the request body: Exceeds the limit (4300 digits)"),
    ],
)
def test_what_python_parses_beyond_json_is_a_400_wherever_it_is(body: bytes, says: str) -> None:
    # free-form fields (a tool's schema, template variables) have no typed field to refuse it
    with pytest.raises(ApiError) as info:
        parse_json(body)
    assert info.value.status == 400 and info.value.message.startswith(says)
    assert parse_json(b'{"order_id": 98765432109876543210, "x": 1e308}')["order_id"] == 98765432109876543210


@pytest.mark.parametrize(
    "body, kind", [(b"[1, 2]", "an array"), (b'"hi"', "a string"), (b"3.5", "a number"), (b"null", "null")]
)
def test_a_body_that_is_not_a_json_object_is_a_400_saying_what_it_is(body: bytes, kind: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_json(body)
    assert info.value.status == 400 and info.value.message == f"the request body must be a JSON object, not {kind}"


def test_cache_control_marks_pin_the_chat_up_to_their_message_or_the_whole_prompt() -> None:
    marked = {"type": "ephemeral"}
    body = ChatCompletionIn.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief.", "cache_control": {**marked, "ttl": "1h"}},
                {"role": "user", "content": [{"type": "text", "text": "Q1", "cache_control": marked}]},
                {"role": "assistant", "content": "A1"},
                {"role": "user", "content": "Q2"},
            ],
            "cache_control": {"ttl": 90},
        }
    )
    assert body.pins() == [PromptPin(3600.0, 1), PromptPin(300.0, 2), PromptPin(90.0)]
    assert body.messages[1].as_dict() == {"role": "user", "content": "Q1"}  # the template sees text only
    assert CompletionIn.model_validate({"prompt": "hi", "cache_control": {"ttl": "90s"}}).pins() == [PromptPin(90.0)]
    assert CompletionIn.model_validate({"prompt": "hi"}).pins() == []


def test_openai_fields_it_cannot_honour_are_refused_unless_null_or_empty() -> None:
    CompletionIn.model_validate({"prompt": "hi", "suffix": None})
    CompletionIn.model_validate({"prompt": "hi", "suffix": ""})
    assert "suffix" in refusal(CompletionIn, {"prompt": "hi", "suffix": "."})


@pytest.mark.parametrize(
    "field, value",
    [
        ("use_beam_search", True),
        ("allowed_token_ids", [5, 6]),
        ("bad_words", ["x"]),
        ("chat_template", "{{ messages }}"),
        ("logits_processors", ["my.module:Processor"]),
        ("prompt_logprobs", 2),
        ("return_tokens_as_token_ids", True),
        ("echo", True),  # a chat's, unlike a completion's
        ("add_special_tokens", True),
        ("functions", [{"name": "f", "parameters": {}}]),  # OpenAI's deprecated form of tools
        ("function_call", "auto"),
    ],
)
def test_vllms_extensions_it_cannot_honour_are_refused_unless_null_or_empty(field: str, value) -> None:
    assert field in refusal(ChatCompletionIn, {"messages": CHAT, field: value})
    ChatCompletionIn.model_validate({"messages": CHAT, field: type(value)()})  # False, [], 0, ""


def test_truncate_prompt_tokens_is_minus_one_or_more_and_not_echoed() -> None:
    assert (
        ChatCompletionIn.model_validate({"messages": CHAT, "truncate_prompt_tokens": -1}).truncate_prompt_tokens == -1
    )
    assert CompletionIn.model_validate({"prompt": "hi", "truncate_prompt_tokens": 8}).truncate_prompt_tokens == 8
    assert "truncate_prompt_tokens" in refusal(CompletionIn, {"prompt": "hi", "truncate_prompt_tokens": -2})
    assert "truncate_prompt_tokens" in refusal(CompletionIn, {"prompt": "hi", "truncate_prompt_tokens": 10**30})
    assert "echo" in refusal(CompletionIn, {"prompt": "hi", "truncate_prompt_tokens": 8, "echo": True})


def test_token_ids_are_cut_by_truncate_prompt_tokens_before_the_context_counts_them() -> None:
    def prompt(body: dict) -> object:
        return CompletionIn.model_validate(body, context={"context_length": 3}).prompt

    assert prompt({"prompt": [1, 2, 3, 4, 5], "truncate_prompt_tokens": 2}) == [4, 5]
    assert prompt({"prompt": [[1, 2, 3, 4, 5], [6]], "truncate_prompt_tokens": -1}) == [[3, 4, 5], [6]]
    assert prompt({"prompt": ["a long text", "b"], "truncate_prompt_tokens": 1}) == ["a long text", "b"]
    with pytest.raises(ValidationError, match="5 token ids"):
        prompt({"prompt": [1, 2, 3, 4, 5]})


def test_add_generation_prompt_false_goes_with_continue_final_message_as_vllm_sends_them() -> None:
    assert "continue_final_message only" in refusal(
        ChatCompletionIn, {"messages": CHAT, "add_generation_prompt": False}
    )
    going_on = {"messages": CHAT, "add_generation_prompt": False, "continue_final_message": True}
    assert ChatCompletionIn.model_validate(going_on).continue_final_message


@pytest.mark.parametrize(
    "constraint, param, spec",
    [
        ({"json": {"type": "object"}}, "json_schema", '{"type": "object"}'),
        ({"json": '{"type": "array"}'}, "json_schema", '{"type": "array"}'),
        ({"json_object": True}, "json_schema", JSON_OBJECT_SCHEMA),
        ({"regex": "a+"}, "regex", "a+"),
        ({"grammar": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
        ({"choice": ["yes", 'say "no"', "ü"]}, "ebnf", 'root ::= "yes" | "say \\"no\\"" | "\\u00fc"'),
    ],
)
def test_vllms_structured_outputs_become_the_grammar_parameter(constraint: dict, param: str, spec: str) -> None:
    sampling = ChatCompletionIn.model_validate({"messages": CHAT, "structured_outputs": constraint}).sampling()
    assert getattr(sampling, param) == spec


@pytest.mark.parametrize(
    "guided, param, spec",
    [
        ({"guided_json": {"type": "object"}}, "json_schema", '{"type": "object"}'),
        ({"guided_regex": "a+", "guided_decoding_backend": "xgrammar"}, "regex", "a+"),
        ({"guided_choice": ["yes", "no"]}, "ebnf", 'root ::= "yes" | "no"'),
        ({"guided_grammar": 'root ::= "a"'}, "ebnf", 'root ::= "a"'),
    ],
)
def test_vllms_older_guided_fields_are_its_structured_outputs(guided: dict, param: str, spec: str) -> None:
    for model, body in ((ChatCompletionIn, {"messages": CHAT}), (CompletionIn, {"prompt": "hi"})):
        assert getattr(model.model_validate({**body, **guided}).sampling(), param) == spec


CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
# SGLang's documented form: free text until a trigger, then one of the structures
STRUCTURES = {
    "type": "structural_tag",
    "structures": [
        {"begin": "<function=weather>", "schema": CITY, "end": "</function>"},
        {"begin": "<t>", "end": "</t>"},
    ],
    "triggers": ["<function=", "<t>"],
}
# ... which xgrammar's own form spells as triggered tags (a structure without a schema: any text)
TRIGGERED = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<function=", "<t>"],
        "tags": [
            {"type": "tag", "begin": "<function=weather>", "content": {"type": "json_schema", "json_schema": CITY}},
            {"type": "tag", "begin": "<t>", "content": {"type": "any_text"}},
        ],
    },
}
TRIGGERED["format"]["tags"][0]["end"], TRIGGERED["format"]["tags"][1]["end"] = "</function>", "</t>"


@pytest.mark.parametrize("tag", [STRUCTURES, TRIGGERED])
def test_a_structural_tag_reaches_the_router_in_xgrammars_form_from_every_route(tag: dict) -> None:
    by_sglang = SamplingParamsIn.model_validate({"structural_tag": json.dumps(tag)}).to_protocol().structural_tag
    assert json.loads(by_sglang) == TRIGGERED
    as_response_format = ChatCompletionIn.model_validate({"messages": CHAT, "response_format": tag})
    by_vllm = CompletionIn.model_validate({"prompt": "hi", "structured_outputs": {"structural_tag": json.dumps(tag)}})
    assert (
        as_response_format.protocol_sampling().structural_tag == by_vllm.protocol_sampling().structural_tag == by_sglang
    )


def test_a_structural_tag_in_neither_form_or_beside_another_constraint_is_refused() -> None:
    def tag_refusal(model: type, tag: object) -> str:
        body = {"messages": CHAT, "response_format": tag} if model is ChatCompletionIn else sampling(structural_tag=tag)
        return refusal(model, body)

    assert "not JSON" in tag_refusal(GenerateIn, "{'type': 'structural_tag'}")
    deep = '{"format": ' + '{"type": "sequence", "elements": [' * 2000 + "{}" + "]}" * 2000 + "}"
    assert "structural_tag is nested too deeply" in tag_refusal(GenerateIn, deep)
    assert "(no triggers given)" in tag_refusal(GenerateIn, {"structures": STRUCTURES["structures"]})
    assert "(no structures given)" in tag_refusal(ChatCompletionIn, {"type": "structural_tag"})
    assert "not both" in tag_refusal(ChatCompletionIn, {**STRUCTURES, "format": TRIGGERED["format"]})
    assert "trigger must not be empty" in tag_refusal(GenerateIn, {**STRUCTURES, "triggers": [""]})
    # xgrammar's own words for these are an internal check's
    unused = {**STRUCTURES, "triggers": [*STRUCTURES["triggers"], "<g="]}
    assert "no structure's begin starts with the trigger '<g='" in tag_refusal(ChatCompletionIn, unused)
    stray = {**STRUCTURES, "triggers": ["<function="]}
    assert "'<t>' starts with none of the triggers" in tag_refusal(GenerateIn, stray)
    assert "begin" in tag_refusal(GenerateIn, {**STRUCTURES, "structures": [{"begin": "", "end": "x"}]})
    assert "at most one of" in refusal(GenerateIn, sampling(regex="a", structural_tag=TRIGGERED))
    huge = {"format": {"type": "const_string", "value": "x" * MAX_GRAMMAR_CHARS}}
    assert f"at most {MAX_GRAMMAR_CHARS}" in tag_refusal(GenerateIn, huge)


def test_guided_fields_conflict_as_constraints_do() -> None:
    two = {"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]}
    assert "exactly one of" in refusal(CompletionIn, two)
    both = {"prompt": "hi", "guided_regex": "a", "structured_outputs": {"regex": "b"}}
    assert "not both" in refusal(CompletionIn, both)
    assert "guided_whitespace_pattern" in refusal(CompletionIn, {"prompt": "hi", "guided_whitespace_pattern": " "})
    assert CompletionIn.model_validate({"prompt": "hi", "guided_json": None}).sampling().json_schema is None


def test_vllms_structured_outputs_take_one_known_constraint_and_its_stop_string_flag_is_no_stop_trim() -> None:
    for constraint in ({}, {"regex": "a", "choice": ["a"]}, {"json_object": False}):
        assert "exactly one of" in refusal(CompletionIn, {"prompt": "hi", "structured_outputs": constraint})
    assert "whitespace_pattern" in refusal(
        CompletionIn, {"prompt": "hi", "structured_outputs": {"regex": "a", "whitespace_pattern": " "}}
    )
    both = {"prompt": "hi", "structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}
    assert "at most one of" in refusal(CompletionIn, both)
    kept = CompletionIn.model_validate({"prompt": "hi", "include_stop_str_in_output": True}).sampling()
    assert kept.no_stop_trim is True


@pytest.mark.parametrize("model, body", [(CompletionIn, {"prompt": "hi"}), (ChatCompletionIn, {"messages": CHAT})])
def test_a_null_openai_field_is_the_field_left_out(model: type, body: dict) -> None:
    nullable = (
        "temperature",
        "top_p",
        "n",
        "max_tokens",
        "presence_penalty",
        "frequency_penalty",
        "stream",
        "logprobs",
    )
    assert model.model_validate({**body, **dict.fromkeys(nullable)}) == model.model_validate(body)
    assert "prompt" in refusal(CompletionIn, {"prompt": None})


def test_a_chats_top_logprobs_need_its_logprobs() -> None:
    assert "top_logprobs needs logprobs" in refusal(ChatCompletionIn, {"messages": CHAT, "top_logprobs": 2})
    ChatCompletionIn.model_validate({"messages": CHAT, "top_logprobs": 2, "logprobs": True})
    ChatCompletionIn.model_validate({"messages": CHAT, "top_logprobs": 0})


def test_the_router_is_told_the_clients_name_of_the_output_limit() -> None:
    """For its refusals: a prompt + limit past the context names the field the client sent."""
    named = {
        "max_tokens": CompletionIn.model_validate({"prompt": "hi"}),
        "max_completion_tokens": ChatCompletionIn.model_validate({"messages": CHAT, "max_completion_tokens": 5}),
        "max_output_tokens": ResponsesIn.model_validate({"input": "hi"}),
    }
    for name, body in named.items():
        assert body.protocol_sampling().max_new_tokens_name == name
    assert SamplingParamsIn().to_protocol().max_new_tokens_name == "max_new_tokens"


def test_vllms_top_k_zero_is_the_whole_vocabulary_on_the_openai_endpoints() -> None:
    for top_k, expected in ((0, -1), (-1, -1), (5, 5)):
        body = CompletionIn.model_validate({"prompt": "hi", "top_k": top_k})
        assert body.sampling().to_protocol().top_k == expected
    assert "top_k" in refusal(CompletionIn, {"prompt": "hi", "top_k": -2})
    assert "top_k must be -1 (off) or at least 1" in str(pytest.raises(ValueError, SamplingParamsIn, top_k=0).value)


def test_a_logit_bias_maps_token_ids_to_what_is_added_to_their_logits() -> None:
    chat = ChatCompletionIn.model_validate({"messages": CHAT, "logit_bias": {"28": 5, "100": -100}})
    assert chat.sampling().to_protocol().logit_bias == {28: 5.0, 100: -100.0}
    for empty in ({}, None):
        assert (
            CompletionIn.model_validate({"prompt": "hi", "logit_bias": empty}).sampling().to_protocol().logit_bias == {}
        )
    native = SamplingParamsIn.model_validate({"logit_bias": {"5": 1.5}})
    assert native.to_protocol().logit_bias == {5: 1.5}
    for bad, why in (
        ({"the": 1}, "keys are token ids (integers)"),
        ({"-1": 1}, "greater than or equal to 0"),
        ({"28": 101}, "less than or equal to 100"),
        ({str(i): 1 for i in range(1025)}, "at most 1024 items"),
    ):
        assert why in refusal(CompletionIn, {"prompt": "hi", "logit_bias": bad})
        assert why in refusal(GenerateIn, {"text": "hi", "sampling_params": {"logit_bias": bad}})


def test_a_seeded_prompts_samples_draw_with_consecutive_seeds() -> None:
    # n samples of one seed would otherwise be n copies of one draw
    body = GenerateIn.model_validate({"text": ["a", "b"], "sampling_params": {"n": 3, "seed": BIG - 1}})
    assert [r.sampling.seed for r in body.expand()] == [BIG - 1, -BIG, -BIG + 1] * 2  # wrapping within int64
    unseeded = GenerateIn.model_validate({"text": "a", "sampling_params": {"n": 2}}).expand()
    assert [r.sampling.seed for r in unseeded] == [None, None]


@pytest.mark.parametrize(
    "body, limit, is_default",
    [
        ({"text": "hi"}, 128, True),
        ({"text": "hi", "sampling_params": {"max_new_tokens": 7}}, 7, False),
        ({"text": "hi", "max_tokens": 9}, 9, False),  # SGLang's top-level limit is the client's too
    ],
)
def test_a_native_limit_left_out_is_marked_as_the_default(body: dict, limit: int, is_default: bool) -> None:
    (request,) = GenerateIn.model_validate(body).expand()
    assert (request.sampling.max_new_tokens, request.sampling.max_new_tokens_is_default) == (limit, is_default)


@pytest.mark.parametrize(
    "model, body, limit, is_default",
    [
        (CompletionIn, {"prompt": "hi"}, 16, True),
        (CompletionIn, {"prompt": "hi", "max_tokens": None}, 16, True),
        (CompletionIn, {"prompt": "hi", "max_tokens": 5}, 5, False),
        (ChatCompletionIn, {"messages": [{"role": "user", "content": "hi"}]}, 512, True),
        (ChatCompletionIn, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}, 3, False),
    ],
)
def test_an_openai_limit_left_out_is_marked_as_the_default(model, body: dict, limit: int, is_default: bool) -> None:
    request = model.model_validate(body)
    sampling = request.sampling().to_protocol(request.default_max_tokens)
    assert (sampling.max_new_tokens, sampling.max_new_tokens_is_default) == (limit, is_default)


def test_a_profile_body_takes_sglangs_defaults_and_bench_servings_strings():
    args = ProfileIn.model_validate({"num_steps": "5", "profile_by_stage": False, "activities": []}).router_args("/d")
    assert args["num_steps"] == 5 and args["activities"] == ["CPU", "GPU"]
    assert (args["with_stack"], args["record_shapes"], args["prefix"]) == (True, True, "")
    assert float(args["profile_id"]) > 0  # the time, as SGLang names a profile
    named = ProfileIn(profile_id="run", profile_prefix="exp", with_stack=False).router_args("/d")
    assert (named["profile_id"], named["prefix"], named["with_stack"]) == ("run", "exp-", False)


def test_a_reasoning_effort_reaches_the_template_as_vllm_passes_it() -> None:
    """The chat's reasoning_effort and the Responses API's reasoning.effort: the template's
    reasoning_effort, and enable_thinking unless it is "none"; the client's own variables win."""
    chat = {"messages": [{"role": "user", "content": "Hi"}]}

    def kwargs(**fields: object) -> object:
        return ChatCompletionIn.model_validate({**chat, **fields}).chat_input()["chat_template_kwargs"]

    assert kwargs() is None
    assert kwargs(reasoning_effort="high") == {"reasoning_effort": "high", "enable_thinking": True}
    assert kwargs(reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False}
    own = {"enable_thinking": False, "reasoning_effort": "low"}
    assert kwargs(reasoning_effort="high", chat_template_kwargs=own) == own
    with pytest.raises(ValidationError, match="reasoning_effort"):
        ChatCompletionIn.model_validate({**chat, "reasoning_effort": "extreme"})
    response = ResponsesIn.model_validate({"input": "Hi", "reasoning": {"effort": "medium", "summary": "auto"}})
    assert response.chat_input()["chat_template_kwargs"] == {"reasoning_effort": "medium", "enable_thinking": True}
    assert ResponsesIn.model_validate({"input": "Hi"}).chat_input()["chat_template_kwargs"] is None


@pytest.mark.parametrize(
    "model, body, says",
    [
        (ChatCompletionIn, {"messages": CHAT, "stream_options": {"include_usage": True}}, "only allowed with stream"),
        (CompletionIn, {"prompt": "hi", "stream": False, "stream_options": {}}, "only allowed with stream"),
        (CompletionIn, {"prompt": "hi", "n": 2, "best_of": 1}, "best_of must be at least n"),
        (CompletionIn, {"prompt": "hi", "best_of": 3}, "best_of 3 is not supported: each choice is one sample"),
        (
            ChatCompletionIn,
            {"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True},
            "cannot both be true",
        ),
        (ChatCompletionIn, {"messages": CHAT, "modalities": ["text", "audio"]}, "modalities.1"),
        (ChatCompletionIn, {"messages": CHAT, "audio": {"voice": "alloy", "format": "wav"}}, "audio output"),
        (ResponsesIn, {"input": "hi", "include": ["weird"]}, "include.0"),
    ],
)
def test_contradictory_or_unanswerable_fields_are_refused_as_openai_and_vllm_refuse_them(model, body, says) -> None:
    assert says in refusal(model, body)


def test_what_they_allow_is_accepted() -> None:
    ChatCompletionIn.model_validate({"messages": CHAT, "stream": True, "stream_options": {"include_usage": True}})
    ChatCompletionIn.model_validate({"messages": CHAT, "modalities": ["text"], "stream_options": None})
    # SGLang's clients send continue_final_message alone (add_generation_prompt left at its default)
    ChatCompletionIn.model_validate(
        {"messages": [*CHAT, {"role": "assistant", "content": "Hel"}], "continue_final_message": True}
    )
    CompletionIn.model_validate({"prompt": "hi", "n": 1, "best_of": 1})
    ResponsesIn.model_validate(
        {"input": "hi", "include": ["message.output_text.logprobs", "reasoning.encrypted_content"]}
    )


@pytest.mark.parametrize(
    "model, body, message",
    [
        (GenerateIn, {"text": "hi", "logprob_start_len": -5}, "logprob_start_len: Input should be greater than"),
        (CompletionIn, {"prompt": "hi", "max_tokens": 2**31}, "max_tokens: Input should be less than or equal to"),
        (ChatCompletionIn, {"messages": CHAT, "max_completion_tokens": 2**31}, "max_completion_tokens: Input"),
        (ResponsesIn, {"input": "hi", "max_output_tokens": 2**31}, "max_output_tokens: Input"),
    ],
)
def test_a_bounded_member_of_a_union_and_an_output_limit_are_named_as_the_client_sent_them(model, body, message):
    """Not "logprob_start_len.constrained-int: ...; logprob_start_len: Input should be a valid list",
    nor the router's max_new_tokens for an OpenAI client's max_tokens."""
    assert refusal(model, body).startswith(message)
