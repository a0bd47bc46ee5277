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

from radixcluster.router.text.tokenizer import load_tokenizer
from support.api_helpers import GREEDY, post

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


def test_choices_say_which_stop_ended_them_as_sglang_does(client, model):
    ask = {"model": model, "messages": QUESTION, "temperature": 0}
    by_string = client.chat.completions.create(**ask, max_tokens=40, stop=[" capital", "Paris"])
    assert by_string.choices[0].finish_reason == "stop" and by_string.choices[0].matched_stop in (" capital", "Paris")
    by_eos = client.chat.completions.create(**ask, max_tokens=200)
    assert (by_eos.choices[0].finish_reason, by_eos.choices[0].matched_stop) == ("stop", 2)  # <|im_end|>
    by_length = client.chat.completions.create(**ask, max_tokens=2)
    assert (by_length.choices[0].finish_reason, by_length.choices[0].matched_stop) == ("length", None)
    streamed = client.completions.create(
        model=model, prompt="One, two, three,", max_tokens=20, temperature=0, stop=[" five"], stream=True
    )
    ends = [(c.choices[0].finish_reason, c.choices[0].matched_stop) for c in streamed if c.choices[0].finish_reason]
    assert ends == [("stop", " five")]
    chunks = list(client.chat.completions.create(**ask, max_tokens=40, stop=[" capital", "Paris"], stream=True))
    assert [c.choices[0].matched_stop for c in chunks if c.choices[0].finish_reason] == [
        by_string.choices[0].matched_stop
    ]


def test_choices_say_which_stop_ended_them_as_vllm_does(client, model):
    """vLLM's stop_reason: the stop string, or one of the request's stop_token_ids; None at EOS."""
    ask = {"model": model, "messages": QUESTION, "temperature": 0}
    by_string = client.chat.completions.create(**ask, max_tokens=40, stop=[" capital", "Paris"])
    assert by_string.choices[0].stop_reason == by_string.choices[0].matched_stop
    by_eos = client.chat.completions.create(**ask, max_tokens=200, extra_body={"return_token_ids": True})
    assert (by_eos.choices[0].matched_stop, by_eos.choices[0].stop_reason) == (2, None)
    ids = by_eos.choices[0].token_ids
    by_id = client.chat.completions.create(**ask, max_tokens=200, extra_body={"stop_token_ids": [ids[1]]})
    assert (by_id.choices[0].finish_reason, by_id.choices[0].stop_reason) == ("stop", ids[1])
    streamed = client.completions.create(
        model=model, prompt="One, two, three,", max_tokens=20, temperature=0, stop=[" five"], stream=True
    )
    assert [c.choices[0].stop_reason for c in streamed if c.choices[0].finish_reason] == [" five"]


def test_sglangs_stop_regex_and_extra_key_work_on_the_openai_endpoints(client, model, server):
    native = post(
        server, "/generate", {"text": "One, two, three,", "sampling_params": {**GREEDY, "stop_regex": "fi[a-z]+"}}
    )
    completion = client.completions.create(
        model=model, prompt="One, two, three,", max_tokens=20, temperature=0, extra_body={"stop_regex": "fi[a-z]+"}
    )
    assert completion.choices[0].text == native.json()["text"] and completion.choices[0].finish_reason == "stop"
    prompt = "The extra key keeps this prompt's cached pages apart from other keys' requests."

    def cached(key: str) -> int:
        resp = client.completions.create(model=model, prompt=prompt, max_tokens=1, extra_body={"extra_key": key})
        return resp.usage.prompt_tokens_details.cached_tokens

    assert cached("k1") == 0 and cached("k1") > 0 and cached("k2") == 0


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
    # SGLang's docs read reasoning_content off every delta and message: null without a parser
    assert all(c.choices[0].delta.reasoning_content is None for c in chunks if c.choices)
    assert whole.choices[0].message.reasoning_content is None
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1
    assert all(c.usage is None for c in chunks[:-1])


def test_return_token_ids_gives_the_prompts_and_each_choices_ids_as_vllm_does(client, model, server):
    """vLLM's ``return_token_ids``: the prompt's ids (those /tokenize gives for the same chat or
    text) and each choice's output ids, streamed chunk by chunk too."""
    asked = {"return_token_ids": True}
    chat = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=8, temperature=0, n=2, extra_body=asked
    )
    tokenized = post(server, "/tokenize", {"messages": QUESTION}).json()["tokens"]
    assert chat.prompt_token_ids == tokenized and len(tokenized) == chat.usage.prompt_tokens
    for choice in chat.choices:
        text = post(server, "/detokenize", {"tokens": choice.token_ids}).json()["text"]
        assert text.startswith(choice.message.content) and len(choice.token_ids) * 2 == chat.usage.completion_tokens
    chunks = list(
        client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=8, temperature=0, stream=True, extra_body=asked
        )
    )
    assert chunks[0].prompt_token_ids == tokenized and all(not hasattr(c, "prompt_token_ids") for c in chunks[1:])
    assert [t for c in chunks for t in c.choices[0].token_ids] == chat.choices[0].token_ids
    prompt = "The capital of France is"
    ids = post(server, "/tokenize", {"prompt": prompt}).json()["tokens"]
    whole = client.completions.create(model=model, prompt=prompt, max_tokens=5, temperature=0, extra_body=asked)
    assert whole.choices[0].prompt_token_ids == ids and len(whole.choices[0].token_ids) == whole.usage.completion_tokens
    streamed = list(
        client.completions.create(
            model=model, prompt=prompt, max_tokens=5, temperature=0, stream=True, extra_body=asked
        )
    )
    assert streamed[0].choices[0].prompt_token_ids == ids
    assert [t for c in streamed for t in c.choices[0].token_ids] == whole.choices[0].token_ids
    plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=2)
    assert not hasattr(plain, "prompt_token_ids") and not hasattr(plain.choices[0], "token_ids")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completion"])
def test_continuous_usage_stats_put_the_counts_so_far_in_every_chunk(client, model, chat):
    """vLLM's ``stream_options.continuous_usage_stats`` (with include_usage): each chunk's usage
    counts its choice's tokens so far, up to the final usage chunk's."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    ask = dict(model=model, max_tokens=8, temperature=0, stream=True, stream_options=options)
    if chat:
        chunks = list(client.chat.completions.create(**ask, messages=QUESTION))
    else:
        chunks = list(client.completions.create(**ask, prompt="The capital of France is"))
    *running, final = chunks
    counts = [c.usage.completion_tokens for c in running]
    assert counts == sorted(counts) and counts[-1] == final.usage.completion_tokens > 0
    assert counts[0] == (0 if chat else 1)  # a chat's first chunk gives the role, before any token
    assert all(c.usage.prompt_tokens == final.usage.prompt_tokens for c in running)
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens for c in running)


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    entries = resp.choices[0].logprobs.content
    assert len(entries) == resp.usage.completion_tokens
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
    # each token by its text (as vLLM and SGLang name it), its UTF-8 bytes beside it
    assert "".join(e.token for e in entries) == resp.choices[0].message.content
    assert all(e.bytes == list(e.token.encode()) for e in entries)
    assert [e.top_logprobs[0].token for e in entries] == [e.token for e in entries]  # greedy: the likeliest


def test_chat_logprobs_bytes_combine_into_characters_split_across_tokens(client, model):
    """🌪 is three tokens, each part of the character: their text is U+FFFD (as SGLang and vLLM
    decode them alone), their bytes OpenAI's, which join into the character."""
    resp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Repeat exactly: 🌪🌪🌪 中文"}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
    )
    entries = resp.choices[0].logprobs.content
    assert any(e.token == "\ufffd" for e in entries) and "🌪" in resp.choices[0].message.content
    joined = b"".join(bytes(e.bytes) for e in entries)  # the limit may cut the last character
    assert joined.decode(errors="replace") == resp.choices[0].message.content


def test_a_developer_message_answers_as_a_system_message(client, model):
    chat = [{"role": "developer", "content": "Answer in one word."}, *QUESTION]
    system = [{**chat[0], "role": "system"}, *QUESTION]
    answers = [
        client.chat.completions.create(model=model, messages=m, max_tokens=6, temperature=0) for m in (chat, system)
    ]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    assert answers[0].usage.prompt_tokens == answers[1].usage.prompt_tokens


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


def test_vllms_older_guided_fields_constrain_the_answer(client, model):
    """Client code written for vLLM before 0.11 sends guided_choice / guided_json in extra_body."""
    ask = {"model": model, "messages": [{"role": "user", "content": "Capital of France?"}], "temperature": 0}
    picked = client.chat.completions.create(**ask, max_tokens=8, extra_body={"guided_choice": ["Lyon", "Nice"]})
    assert picked.choices[0].message.content in ("Lyon", "Nice")
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"]}
    shaped = client.completions.create(
        model=model, prompt="City:", max_tokens=48, temperature=0, extra_body={"guided_json": schema}
    )
    assert json.loads(shaped.choices[0].text)["city"] in ("Paris", "Lyon")


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def test_a_forced_tool_call_comes_back_as_tool_calls(client, model):
    """tool_choice "required" or a named function (vLLM's way: generated under the tools' JSON
    schema): the SDK reads tool_calls whose arguments parse, streamed or not; then the tool's
    answer goes back into the chat."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    ask = {"model": model, "messages": messages, "tools": WEATHER_TOOLS, "temperature": 0, "max_tokens": 96}
    choice = client.chat.completions.create(**ask, tool_choice=named).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # OpenAI's finish for a named call
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    required = client.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False).choices[0]
    assert required.finish_reason == "tool_calls" and len(required.message.tool_calls) == 1
    assert required.message.tool_calls[0].function.name in ("get_weather", "get_time")
    json.loads(required.message.tool_calls[0].function.arguments)
    chunks = list(client.chat.completions.create(**ask, tool_choice="required", parallel_tool_calls=False, stream=True))
    streamed = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
    assert [c.function.name for c in streamed] == [required.message.tool_calls[0].function.name]
    assert json.loads(streamed[0].function.arguments) == json.loads(required.message.tool_calls[0].function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    answered = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"},
    ]
    reply = client.chat.completions.create(
        model=model, messages=answered, tools=WEATHER_TOOLS, tool_choice="none", temperature=0, max_tokens=16
    )
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None


def test_tool_calls_cut_short_stay_text_and_auto_is_refused(client, model):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    cut = client.chat.completions.create(
        model=model, messages=messages, tools=WEATHER_TOOLS, tool_choice=named, temperature=0, max_tokens=3
    ).choices[0]
    assert cut.finish_reason == "length" and cut.message.tool_calls is None and cut.message.content.startswith("{")
    with pytest.raises(openai.BadRequestError, match="needs the server started with --tool-call-parser"):
        client.chat.completions.create(model=model, messages=messages, tools=WEATHER_TOOLS, max_tokens=4)


def test_the_responses_api_gives_the_messages_logprobs_as_the_chat_does(client, model):
    """``include=["message.output_text.logprobs"]`` with ``top_logprobs``: the output text's
    tokens and logprobs, the chat's for the same greedy answer, streamed with the deltas too."""
    chat = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    expected = chat.choices[0].logprobs.content
    ask = dict(model=model, input=QUESTION[0]["content"], max_output_tokens=12, temperature=0, top_logprobs=2)
    response = client.responses.create(**ask, include=["message.output_text.logprobs"])
    (part,) = response.output[0].content
    assert [e.token for e in part.logprobs] == [e.token for e in expected]
    assert [e.logprob for e in part.logprobs] == pytest.approx([e.logprob for e in expected], abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in part.logprobs)
    assert "".join(e.token for e in part.logprobs).startswith(part.text)  # then the stop token, as the chat's
    events = list(client.responses.create(**ask, include=["message.output_text.logprobs"], stream=True))
    streamed = [e.token for event in events if event.type == "response.output_text.delta" for e in event.logprobs]
    assert streamed == [e.token for e in part.logprobs]
    unasked = client.responses.create(**{**ask, "top_logprobs": None})
    assert unasked.output[0].content[0].logprobs == []


def test_the_responses_api_makes_and_reads_back_function_calls(client, model):
    """``client.responses`` with flat function tools: a named or required call is a
    ``function_call`` item (streamed through the SDK's own accumulator), and sent back as input
    with its ``function_call_output`` it reaches the template as the chat's tool messages."""
    tools = [{"type": "function", **tool["function"]} for tool in WEATHER_TOOLS]
    ask = {"model": model, "input": "What is the weather in Paris?", "tools": tools, "temperature": 0}
    named = client.responses.create(
        **ask, tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=96
    )
    (call,) = named.output
    assert (call.type, call.name, call.status, named.status) == (
        "function_call",
        "get_weather",
        "completed",
        "completed",
    )
    assert set(json.loads(call.arguments)) == {"city", "unit"} and named.output_text == ""
    assert call.call_id.startswith("call_") and named.tools[0].name == "get_weather"
    with client.responses.stream(
        **ask, tool_choice="required", parallel_tool_calls=False, max_output_tokens=96
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    (required,) = streamed.output
    assert required.type == "function_call" and required.name in ("get_weather", "get_time")
    json.loads(required.arguments)
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    answered = [
        {"role": "user", "content": "What is the weather in Paris?"},
        call,
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees and sunny"},
    ]
    reply = client.responses.create(
        model=model, input=answered, tools=tools, tool_choice="none", temperature=0, max_output_tokens=16
    )
    assert [item.type for item in reply.output] == ["message"] and reply.output_text
    with pytest.raises(openai.BadRequestError, match="needs the server started with --tool-call-parser"):
        client.responses.create(**ask, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError, match="tools of type 'web_search'"):
        client.responses.create(model=model, input="Hi", tools=[{"type": "web_search"}])


def test_chat_continues_the_final_assistant_message(server, client, model, model_path):
    """continue_final_message (SGLang's and vLLM's): the prompt ends inside the assistant's
    message, as the native API answers that text."""
    messages = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    resp = client.chat.completions.create(
        model=model, messages=messages, max_tokens=6, temperature=0, extra_body={"continue_final_message": True}
    )
    text = load_tokenizer(model_path).apply_chat_template(messages, continue_final_message=True)
    assert text.endswith("The capital of France is")
    native = requests.post(
        server.url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
        headers=server.headers(),
        timeout=120,
    ).json()
    assert resp.choices[0].message.content == native["text"]
    assert resp.usage.prompt_tokens == native["meta_info"]["prompt_tokens"]


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


def test_min_tokens_keeps_every_stop_away_until_then(client, model):
    """vLLM's min_tokens (SGLang's min_new_tokens): EOS and stop_token_ids cannot be sampled
    before it, and stop strings do not end the text there."""
    prompt = "<|im_start|>user\nSay just the word yes.<|im_end|>\n<|im_start|>assistant\n"
    ask = dict(model=model, prompt=prompt, max_tokens=30, temperature=0, extra_body={"return_token_ids": True})
    short = client.completions.create(**ask).choices[0]
    assert short.finish_reason == "stop" and len(short.token_ids) < 10  # the EOS would come early
    held = client.completions.create(**ask | {"extra_body": {"return_token_ids": True, "min_tokens": 10}}).choices[0]
    assert 2 not in held.token_ids[:-1] and len(held.token_ids) > 10 and "<|im_start|>" not in held.text
    dot = short.token_ids[-2]  # the answer's last token before the EOS
    stops = {"min_tokens": 10, "stop_token_ids": [dot], "return_token_ids": True}
    late = client.completions.create(**ask | {"extra_body": stops}).choices[0]
    assert dot not in late.token_ids[:10]
    by_string = client.completions.create(**ask | {"stop": ["."], "extra_body": {"min_tokens": 10}}).usage
    assert by_string.completion_tokens >= 10


def test_a_stop_tokens_text_is_left_out_unless_asked_for(server, client, model):
    """As SGLang's no_stop_trim and vLLM's include_stop_str_in_output: the token that ended the
    answer stays in its ids, its text only when asked for."""
    prompt = "The capital of France is"
    plain = client.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, extra_body={"return_token_ids": True}
    )
    stop_id = plain.choices[0].token_ids[1]
    ask = dict(model=model, prompt=prompt, max_tokens=4, temperature=0)
    trimmed = client.completions.create(**ask, extra_body={"stop_token_ids": [stop_id], "return_token_ids": True})
    kept = client.completions.create(
        **ask, extra_body={"stop_token_ids": [stop_id], "include_stop_str_in_output": True}
    )
    assert trimmed.choices[0].token_ids == plain.choices[0].token_ids[:2]
    assert kept.choices[0].text.startswith(trimmed.choices[0].text) and len(kept.choices[0].text) > len(
        trimmed.choices[0].text
    )
    assert plain.choices[0].text.startswith(kept.choices[0].text)
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "stop_token_ids": [stop_id]}}
    native = post(server, "/generate", body).json()
    assert native["text"] == trimmed.choices[0].text and native["meta_info"]["finish_reason"]["matched"] == stop_id
    chat = "<|im_start|>user\nSay just the word yes.<|im_end|>\n<|im_start|>assistant\n"
    eos = {"text": chat, "sampling_params": {"max_new_tokens": 30, "temperature": 0, "skip_special_tokens": False}}
    answer = post(server, "/generate", eos).json()
    assert answer["meta_info"]["finish_reason"]["matched"] == 2 and "<|im_end|>" not in answer["text"]


def test_completion_logprobs(client, model):
    resp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == resp.usage.completion_tokens
    assert all(len(top) == 3 for top in lp.top_logprobs)
    assert lp.tokens[0] == " Paris" and "".join(lp.tokens) == resp.choices[0].text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(max(top, key=top.get) == token for top, token in zip(lp.top_logprobs, lp.tokens))


def test_completion_top_logprobs_always_list_the_chosen_token(client, model):
    """OpenAI's legacy completions: up to logprobs + 1 entries, the chosen token among them
    (a sampled one, or a prompt token under echo, that is not among the likeliest)."""
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
    resp = client.completions.create(model=model, prompt=prompt, max_tokens=8, logprobs=2, echo=True, seed=3)
    lp = resp.choices[0].logprobs
    for token, logprob, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[token] == logprob and len(top) in (2, 3)
        assert len(top) == 2 or min(top.values()) == logprob  # the extra entry is the chosen one
    assert any(len(top) == 3 for top in lp.top_logprobs[1:])  # " quick" after "The" is no top-2 token


def test_completion_echo_scores_the_prompt_as_generate_does(server, client, model):
    """echo with logprobs, as lm-eval's loglikelihood asks it (max_tokens 1, logprobs 1): the
    prompt's text, then one entry per prompt token (the first unscored) equal to /generate's
    prompt logprobs, then the output's; asked twice (the prompt cached by then), the same."""
    prompt = "The capital of France is Paris"
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    native = requests.post(
        server.url + "/generate",
        json={**body, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 1},
        headers=server.headers(),
        timeout=120,
    ).json()["meta_info"]
    expected = [lp for lp, _, _ in native["input_token_logprobs"]] + [native["output_token_logprobs"][0][0]]
    for _ in range(2):
        resp = client.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True)
        choice = resp.choices[0]
        assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
        lp = choice.logprobs
        assert len(lp.tokens) == resp.usage.prompt_tokens + 1 == len(expected)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert "".join(lp.tokens) == choice.text and lp.tokens[-2] == " Paris"
        assert lp.token_logprobs[1:] == pytest.approx(expected[1:], abs=1e-4)
        # the greedy check lm-eval makes: " Paris" is the most likely token after the question
        assert lp.token_logprobs[-2] == pytest.approx(max(lp.top_logprobs[-2].values()), abs=1e-6)
    # scoring the prompt computes it again: nothing of it comes from the cache
    assert resp.usage.prompt_tokens_details.cached_tokens == 0


def test_completion_echo_of_token_ids_zero_tokens_and_streams(client, model):
    """Token ids echo as the tokenizer reads them back; max_tokens 0 echoes the prompt alone;
    a stream's chunks add up to the whole answer, the prompt first."""
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    resp = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert resp.choices[0].text == "The capital of France is"
    assert resp.usage.completion_tokens == 0
    assert len(resp.choices[0].logprobs.token_logprobs) == len(ids)
    lp = resp.choices[0].logprobs  # logprobs 0: each entry lists the chosen token alone, as vLLM's
    assert lp.top_logprobs[1:] == [{t: v} for t, v in zip(lp.tokens[1:], lp.token_logprobs[1:])]
    plain = client.completions.create(model=model, prompt="Hello, my name is", max_tokens=6, temperature=0)
    params = dict(model=model, prompt="Hello, my name is", max_tokens=6, temperature=0, echo=True, n=2)
    whole = client.completions.create(**params)
    assert [c.text for c in whole.choices] == ["Hello, my name is" + plain.choices[0].text] * 2
    chunks = [c.choices[0] for c in client.completions.create(**params, stream=True, logprobs=2) if c.choices]
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert mine[0].text.startswith("Hello, my name is")
        assert "".join(c.text for c in mine) == whole.choices[index].text
        scored = [v for c in mine for v in c.logprobs.token_logprobs]
        assert len(scored) == whole.usage.prompt_tokens + whole.usage.completion_tokens // 2 and scored[0] is None
        # the offsets run on across the chunks, each token's where its text starts in the choice's
        offsets = [o for c in mine for o in c.logprobs.text_offset]
        tokens = [t for c in mine for t in c.logprobs.tokens]
        assert offsets == [len("".join(tokens[:i])) for i in range(len(tokens))]
        assert "".join(tokens) == whole.choices[index].text


def test_completion_logprobs_of_characters_split_across_tokens_join_into_the_text(client, model):
    """As vLLM: a token that is part of a character is "" and the one that completes it holds
    it, so the tokens join into the text, streamed or not, with the same offsets; the chosen
    token is listed in its top_logprobs with its own logprob."""
    params = dict(model=model, prompt="写一首关于春天的诗", max_tokens=9, temperature=0, logprobs=2, echo=True)
    whole = client.completions.create(**params).choices[0]
    lp = whole.logprobs
    assert "" in lp.tokens
    assert "".join(lp.tokens) == whole.text  # its last character cut by the limit: U+FFFD in both
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(top[t] == v for t, v, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]))
    chunks = [c.choices[0] for c in client.completions.create(**params, stream=True) if c.choices]
    assert [t for c in chunks for t in c.logprobs.tokens] == lp.tokens
    assert [o for c in chunks for o in c.logprobs.text_offset] == lp.text_offset


def test_completion_echo_of_token_ids_keeps_special_tokens(client, model):
    """As vLLM echoes a prompt of ids: its text with the special tokens, as its logprobs name them."""
    ids = [1, 4093, 198, 28120, 2, 198]  # "<|im_start|>user\nhello<|im_end|>\n"
    choice = client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=0).choices[0]
    assert choice.text == "<|im_start|>user\nhello<|im_end|>\n" == "".join(choice.logprobs.tokens)


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
        client.completions.create(model=model, prompt="hi", max_tokens=4, suffix="!")
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


def test_a_seeded_requests_n_choices_differ_and_repeat(client, model):
    params = dict(model=model, prompt="Once upon a time", n=3, seed=11, temperature=1.0, max_tokens=12)
    first, again = (client.completions.create(**params) for _ in range(2))
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices] and len(set(texts)) == 3


def test_the_responses_api_answers_as_the_chat_does(client, model, server):
    """``client.responses.create``: the instructions and input read as a chat, the same
    greedy answer; a stream's deltas add up to it between the API's typed events."""
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "system", "content": "Be brief."}, *QUESTION], max_tokens=30, temperature=0
    )
    ask = dict(model=model, input=QUESTION[0]["content"], instructions="Be brief.", max_output_tokens=30, temperature=0)
    response = client.responses.create(**ask)
    assert response.status == "completed" and response.output_text == chat.choices[0].message.content
    counted = client.responses.input_tokens.count(model=model, input=ask["input"], instructions="Be brief.")
    assert counted.input_tokens == response.usage.input_tokens
    assert response.output[0].role == "assistant" and response.id.startswith("resp_")
    assert (response.usage.input_tokens, response.usage.output_tokens) == (
        chat.usage.prompt_tokens,
        chat.usage.completion_tokens,
    )
    assert response.usage.input_tokens_details.cached_tokens > 0  # the chat's prompt, cached
    events = list(client.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text == response.output_text
    cut = client.responses.create(**{**ask, "max_output_tokens": 2})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=model, input="Hi", previous_response_id=response.id)
    with pytest.raises(openai.NotFoundError, match="stores no responses"):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError, match="stores no responses"):
        client.responses.input_items.list(response.id)
    # a stream that fails after its first event ends with the API's error event
    late = {"input": "Count to ten thousand.", "max_output_tokens": 4000, "ignore_eos": True, "deadline_s": 3}
    with post(server, "/v1/responses", {**late, "stream": True}, stream=True) as resp:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    assert lines[-2] == "event: error"
    error = json.loads(lines[-1][len("data: ") :])
    assert (error["type"], error["code"]) == ("error", "deadline_exceeded") and "deadline_s" in error["message"]
    numbers = [json.loads(line[len("data: ") :])["sequence_number"] for line in lines if line.startswith("data: ")]
    assert numbers == list(range(len(numbers)))  # the error event is numbered after the others
    # refused at once, a stream is still the HTTP error, before any event
    too_long = post(server, "/v1/responses", {"input": "word " * 9000, "stream": True})
    assert too_long.status_code == 400 and "context length" in too_long.json()["error"]["message"]


def test_sagemakers_invocations_serve_a_chat_or_a_completion_as_vllm_does(server, client, model):
    """POST /invocations (with /ping, SageMaker's contract): the body says which call it is."""
    chat = {"model": model, "messages": QUESTION, "max_tokens": 8, "temperature": 0}
    direct = client.chat.completions.create(**chat).choices[0].message.content
    invoked = post(server, "/invocations", chat).json()
    assert invoked["object"] == "chat.completion" and invoked["choices"][0]["message"]["content"] == direct
    completion = {"model": model, "prompt": "One, two, three,", "max_tokens": 4, "temperature": 0}
    assert post(server, "/invocations", completion).json()["choices"][0]["text"] == (
        client.completions.create(**completion).choices[0].text
    )
    with post(server, "/invocations", {**chat, "stream": True}, stream=True) as resp:
        frames = [line for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]" and '"chat.completion.chunk"' in frames[0]
    refused = post(server, "/invocations", {"input": "Hi"})
    assert refused.status_code == 400 and "a chat (a JSON object with messages)" in refused.json()["error"]["message"]
    assert "messages" in post(server, "/invocations", {"messages": []}).json()["error"]["message"]
