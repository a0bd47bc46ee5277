"""What SGLang 0.5.x clients send and call besides plain /generate, against a real
`radixcluster up`: GenerateReqInput and SamplingParams fields (implemented, accepted at
their defaults, or refused by name), per-prompt logprob options, model and server info,
tokenize/detokenize, abort and model cards; and SGLang's serving flags on a server of their own."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests

from support.api_helpers import GREEDY, TIMEOUT_S, assert_error, generate, get, post, sse_events
from support.servers import launch_server

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.mark.parametrize(
    "extra",
    [
        # what SGLang's frontend and bench_serving send on every request, at their defaults
        {"lora_path": None, "return_routed_experts": False, "logprob_start_len": -1, "return_logprob": False},
        {"image_data": None, "return_hidden_states": False, "custom_logit_processor": None, "session_params": None},
        {"return_text_in_logprobs": False, "token_ids_logprob": None, "log_metrics": True, "priority": 0},
        {"no_such_field_anywhere": 1},  # unknown top-level fields are ignored, as SGLang ignores them
    ],
)
def test_fields_at_their_defaults_are_accepted(server, extra):
    assert generate(server, PROMPT, max_new_tokens=2, **extra)["meta_info"]["completion_tokens"] <= 2


def test_the_frontends_sampling_params_are_accepted(server):
    # SglSamplingParams.to_srt_kwargs() plus the frontend's global detokenization flags
    params = {
        "skip_special_tokens": True,
        "spaces_between_special_tokens": True,
        "max_new_tokens": 2,
        "min_new_tokens": 0,
        "n": 1,
        "stop": [],
        "stop_token_ids": [],
        "stop_regex": [],
        "temperature": 0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "ignore_eos": False,
        "regex": None,
        "json_schema": None,
        "stream_interval": 4,
        "logit_bias": {},
    }
    resp = post(server, "/generate", {"text": PROMPT, "sampling_params": params})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "body, field",
    [
        ({"lora_path": "my-adapter"}, "lora_path"),
        ({"image_data": ["data:image/png;base64,AAAA"]}, "image_data"),
        ({"custom_logit_processor": "{}"}, "custom_logit_processor"),
        ({"token_ids_logprob": [1, 2]}, "token_ids_logprob"),
        ({"return_hidden_states": True}, "return_hidden_states"),
        ({"input_embeds": [[0.0] * 576] * 3}, "input_embeds"),  # zeros are an embedding, not a default
        ({"input_embeds": [[0, 0]]}, "input_embeds"),  # as JSON.stringify writes them
        ({"sampling_params": {"stop_regex": "(unclosed"}}, "stop_regex"),
        ({"sampling_params": {"no_such_param": 1}}, "unknown field"),  # SGLang too rejects unknown sampling keys
    ],
)
def test_what_we_do_not_implement_is_refused_by_name(server, body, field):
    assert_error(post(server, "/generate", {"text": PROMPT, **body}), 400, field)


def test_per_prompt_logprob_options_of_a_batch(server):
    body = {
        "text": [PROMPT, "Water boils at"],
        "sampling_params": {**GREEDY, "max_new_tokens": 2},
        "return_logprob": [True, False],
        "logprob_start_len": [0, -1],
        "return_text_in_logprobs": True,
    }
    resp = post(server, "/generate", body)
    assert resp.status_code == 200, resp.text
    first, second = resp.json()
    entries = first["meta_info"]["input_token_logprobs"]
    assert len(entries) == first["meta_info"]["prompt_tokens"]
    assert "".join(text for _, _, text in entries) == PROMPT
    assert [text for _, _, text in first["meta_info"]["output_token_logprobs"]] != [None, None]
    assert "input_token_logprobs" not in second["meta_info"]
    refused = post(server, "/generate", {"text": PROMPT, "return_logprob": [True, False]})
    assert_error(refused, 400, "return_logprob")


def test_model_and_server_info_under_every_name_sglang_uses(server):
    info = get(server, "/get_model_info").json()
    assert get(server, "/model_info").json() == info
    assert info["model_path"].endswith(".gguf") and info["is_generation"] is True
    assert info["tokenizer_path"] == info["model_path"]
    assert (info["model_type"], info["architectures"]) == ("llama", ["LlamaForCausalLM"])
    # SGLang's label of the weights, which RL trainers read
    assert info["weight_version"] == "default" == get(server, "/get_weight_version").json()["weight_version"]
    assert get(server, "/weight_version").json() == {"weight_version": "default"}
    update = post(server, "/update_weights_from_disk", {"model_path": "/elsewhere"})
    assert update.status_code == 400 and update.json()["success"] is False and "in place" in update.json()["message"]
    assert get(server, "/server_info").json()["model_path"] == info["model_path"]
    server_info = get(server, "/get_server_info").json()
    assert server_info["context_length"] > 0
    # every flag, as SGLang reports its server args (its default here), the keys left out
    assert server_info["mem_fraction_static"] is None and server_info["schedule_conservativeness"] == 1.0
    assert server_info["host"] == "127.0.0.1" and "api_key" not in server_info and "admin_api_key" not in server_info
    assert get(server, "/version").json() == {"version": server_info["version"]}  # vLLM's


def test_get_load_as_sglangs_router_polls_it(server):
    body = {"text": "Count slowly:", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}, "stream": True}
    with requests.post(
        server.url + "/generate", json=body, headers=server.headers(), stream=True, timeout=TIMEOUT_S
    ) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection, which aborts the request
        next(line for line in lines if line.startswith(b"data: "))  # it runs
        (busy,) = get(server, "/get_load").json()
        assert busy["dp_rank"] == 0 and busy["num_reqs"] >= 1 and busy["num_tokens"] > 0
        assert busy["num_reqs"] >= busy["num_waiting_reqs"] >= 0
        assert get(server, "/load").json()["server_load"] == 1  # vLLM's name for the same
        assert post(server, "/abort_request", {"abort_all": True}).status_code == 200
    # nothing running or waiting: no request, and no token but what the tree holds (evictable)
    assert get(server, "/get_load").json() == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    deadline = time.monotonic() + 30  # the api ends the aborted generation when its last output comes
    while get(server, "/load").json()["server_load"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert get(server, "/load").json()["server_load"] == 0


def test_model_card_by_id(server):
    model = get(server, "/v1/models").json()["data"][0]["id"]
    card = get(server, f"/v1/models/{model}").json()
    assert card["id"] == model and card["max_model_len"] == get(server, "/server_info").json()["context_length"]
    assert_error(get(server, "/v1/models/not-this-one"), 404, "not-this-one")


def test_tokenize_and_detokenize(server):
    one = post(server, "/tokenize", {"prompt": "Hello, world"}).json()
    assert one["count"] == len(one["tokens"]) > 0 and one["max_model_len"] > 0
    two = post(server, "/v1/tokenize", {"prompt": ["Hello, world", "你好"]}).json()
    assert two["tokens"][0] == one["tokens"] and two["count"] == [len(t) for t in two["tokens"]]
    # SGLang's ``text``, and vLLM's ``prompt``
    assert post(server, "/detokenize", {"tokens": one["tokens"]}).json() == {
        "text": "Hello, world",
        "prompt": "Hello, world",
    }
    assert post(server, "/v1/detokenize", {"tokens": two["tokens"]}).json()["text"] == ["Hello, world", "你好"]
    # vLLM's return_token_strs: each id's vocabulary entry
    strs = post(server, "/tokenize", {"prompt": "Hello, world", "return_token_strs": True}).json()
    assert strs["tokens"] == one["tokens"] and strs["token_strs"] == ["Hello", ",", "Ġworld"]
    assert "token_strs" not in one
    chat = post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    spelled = post(server, "/detokenize", {"tokens": chat["tokens"], "skip_special_tokens": False}).json()["text"]
    assert spelled.startswith("<|im_start|>") and spelled.endswith("<|im_start|>assistant\n")
    # a chat's tools and template variables go to the template as the chat endpoint sends them
    # (SmolLM2's reads neither); one that would set the messages is refused
    tools = [{"type": "function", "function": {"name": "now"}}]
    extras = {"tools": tools, "chat_template_kwargs": {"enable_thinking": False}}
    rendered = post(server, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}], **extras}).json()
    assert rendered["tokens"] == chat["tokens"]
    bad = {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"messages": []}}
    assert_error(post(server, "/tokenize", bad), 400, "may not set messages")
    assert_error(
        post(server, "/tokenize", {**bad, "chat_template_kwargs": None, "tools": [{"type": "x"}]}), 400, "tools"
    )
    assert_error(post(server, "/detokenize", {"tokens": [10**6]}), 400, "vocabulary")
    assert_error(post(server, "/tokenize", {}), 400, "prompt")


def test_tokenize_counts_a_prefilled_answer_as_the_chat_serves_it(server):
    """vLLM's continue_final_message: the ids end inside the assistant's message, as the chat's
    prompt_token_ids do (no <|im_end|> after it)."""
    chat = [{"role": "user", "content": "写一首诗"}, {"role": "assistant", "content": "春眠不觉晓，"}]
    body = {"messages": chat, "add_generation_prompt": False, "continue_final_message": True}
    ids = post(server, "/tokenize", body).json()["tokens"]
    served = post(server, "/v1/chat/completions", {**body, "max_tokens": 1, "return_token_ids": True}).json()
    assert ids == served["prompt_token_ids"]
    text = post(server, "/detokenize", {"tokens": ids, "skip_special_tokens": False}).json()["text"]
    assert text.endswith("春眠不觉晓，")
    both = {**body, "add_generation_prompt": True}
    assert post(server, "/tokenize", both).json()["error"]["param"] == "add_generation_prompt"


TOOLS = [
    {"type": "function", "function": {"name": "get_time"}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
]


@pytest.mark.parametrize(
    "parser, text, before",
    [
        (
            "hermes",
            'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Checking.",
        ),
        ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
        ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', ""),
        ("pythonic", '[get_weather(city="Paris")]', ""),
    ],
)
def test_parse_function_call_reads_calls_as_the_chat_endpoint_does(server, parser, text, before):
    body = {"text": text, "tools": TOOLS, "tool_call_parser": parser}
    call = {"tool_index": 1, "name": "get_weather", "parameters": '{"city": "Paris"}'}  # SGLang's ToolCallItem
    assert post(server, "/parse_function_call", body).json() == {"normal_text": before, "calls": [call]}


def test_parse_function_call_leaves_text_without_calls_to_known_tools(server):
    unknown = '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>'
    for text in ("Just an answer.", unknown):
        body = {"text": text, "tools": TOOLS, "tool_call_parser": "hermes"}
        assert post(server, "/parse_function_call", body).json() == {"normal_text": text, "calls": []}
    assert_error(post(server, "/parse_function_call", {"text": "x", "tool_call_parser": "nope"}), 400, "hermes")
    # the server was started without --tool-call-parser: the request must name one
    assert_error(post(server, "/parse_function_call", {"text": "x"}), 400, "--tool-call-parser")


def test_separate_reasoning_splits_thinking_from_the_answer(server):
    body = {"text": "<think>It is Paris.</think>\n\nParis.", "reasoning_parser": "qwen3"}
    assert post(server, "/separate_reasoning", body).json() == {"reasoning_text": "It is Paris.", "text": "Paris."}
    # DeepSeek-R1's template opens the thinking in the prompt: its answers start inside it
    r1 = {"text": "It is Paris.</think>Paris.", "reasoning_parser": "deepseek-r1", "return_blocks": True}
    assert post(server, "/separate_reasoning", r1).json() == {
        "reasoning_text": "It is Paris.",
        "text": "Paris.",
        "reasoning_blocks": ["It is Paris."],
        "text_blocks": ["Paris."],
        "blocks": [{"type": "reasoning", "text": "It is Paris."}, {"type": "text", "text": "Paris."}],
    }
    plain = {"text": "Paris.", "reasoning_parser": "qwen3"}
    assert post(server, "/separate_reasoning", plain).json() == {"reasoning_text": "", "text": "Paris."}
    assert_error(post(server, "/separate_reasoning", {"text": "x"}), 400, "--reasoning-parser")


def test_abort_request_ends_a_running_generation(server):
    body = {
        "text": PROMPT,
        "rid": "abort-me",
        "stream": True,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
    }
    resp = requests.post(server.url + "/generate", json=body, headers=server.headers(), stream=True, timeout=TIMEOUT_S)
    lines = (line for line in resp.iter_lines() if line.startswith(b"data: "))
    next(lines)  # it runs
    threading.Thread(target=lambda: post(server, "/abort_request", {"rid": "abort-me"})).start()
    events = [line[6:] for line in lines]
    assert events[-1] == b"[DONE]"
    last = json.loads(events[-2])["meta_info"]
    assert last["finish_reason"]["type"] == "abort" and last["completion_tokens"] < 400
    assert_error(post(server, "/abort_request", {}), 400, "rid")


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "best_of": 2}, "best_of"),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "lora_path": "adapter"}, "lora_path"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "lora_path": "a"}, "lora_path"),
    ],
)
def test_openai_endpoints_refuse_sglang_extensions_we_do_not_implement(server, path, body, field):
    assert_error(post(server, path, body), 400, field)


def test_sglangs_serving_flags_work_as_pasted():
    """An SGLang command line: metrics, torch.compile, CUDA-graph and watchdog flags accepted, a
    prefill cap below the chunk size, SGLang's name of the CPU attention backend, and
    --stream-interval 4: a stream gets its first token at once, then four at a time (three for a
    request that asks for its own stream_interval)."""
    flags = (
        "--enable-metrics --enable-torch-compile --cuda-graph-max-bs 8 --watchdog-timeout 300 "
        "--max-prefill-tokens 1024 --attention-backend intel_amx --stream-interval 4 --random-seed 42 "
        "--tool-call-parser qwen25 --reasoning-parser qwen3"
    )
    with launch_server(*flags.split()) as handle:
        info = get(handle, "/get_server_info").json()
        assert (info["stream_interval"], info["chunked_prefill_size"]) == (4, 1024)
        body = {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 10, "ignore_eos": True}}
        with post(handle, "/generate", {**body, "stream": True}, stream=True) as resp:
            assert resp.status_code == 200
            chunks = sse_events(resp)[:-1]
        assert [len(c["output_ids"]) for c in chunks] == [1, 5, 9, 10]
        own = {**body, "sampling_params": {**body["sampling_params"], "stream_interval": 3}}
        with post(handle, "/generate", {**own, "stream": True}, stream=True) as resp:
            assert [len(c["output_ids"]) for c in sse_events(resp)[:-1]] == [1, 4, 7, 10]
        whole = generate(handle, PROMPT, max_new_tokens=10, sampling_params={"ignore_eos": True})
        assert (chunks[-1]["output_ids"], chunks[-1]["text"]) == (whole["output_ids"], whole["text"])
        assert get(handle, "/metrics").status_code == 200
        assert_a_grammar_holds_after_the_thinking(handle)
        assert_reads_thinking_and_calls_in_qwens_format(handle)


def assert_a_grammar_holds_after_the_thinking(handle) -> None:
    """--reasoning-parser qwen3: a chat that thinks (Qwen 3's default) holds its grammar back only
    once its answer opens the thinking with a <think> token, which SmolLM2 does not have, so the
    grammar holds from the first token, as with the thinking off. /generate holds it back when
    asked (SGLang's require_reasoning): the thinking is open from the start until </think>, which
    SmolLM2 never writes, so it answers as it would unconstrained."""
    regex = "zz[0-9]{3}"
    chat = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12, **GREEDY}
    for kwargs in (None, {"enable_thinking": False}):
        body = {**chat, "regex": regex, "chat_template_kwargs": kwargs}
        content = post(handle, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
        assert re.fullmatch(regex, content), content
    free = generate(handle, PROMPT, 12)["text"]
    assert re.fullmatch(regex, generate(handle, PROMPT, 12, sampling_params={"regex": regex})["text"])
    assert generate(handle, PROMPT, 12, sampling_params={"regex": regex}, require_reasoning=True)["text"] == free
    assert not free.startswith("zz")


def assert_reads_thinking_and_calls_in_qwens_format(handle) -> None:
    """--reasoning-parser qwen3 --tool-call-parser qwen25: with tool_choice "auto" the answer's
    <think> part is reasoning_content and its <tool_call> block tool_calls (written here under a
    regex, as a Qwen model writes them unasked), the text between them content, streamed or not;
    separate_reasoning false leaves the text whole."""
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    written = (
        "<think>\\nThe user asks the time\\.\\n</think>\\n\\nIt is late\\."
        '<tool_call>\\{"name": "get_time", "arguments": \\{"zone": "UTC"\\}\\}</tool_call>'
    )
    body = {
        "messages": [{"role": "user", "content": "Time?"}],
        "tools": tools,
        "regex": written,
        "max_tokens": 160,
        "temperature": 0,
    }
    choice = post(handle, "/v1/chat/completions", body).json()["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] == "It is late."
    assert message["reasoning_content"] == "\nThe user asks the time.\n"
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    with post(handle, "/v1/chat/completions", {**body, "stream": True}, stream=True) as resp:
        deltas = [e["choices"][0] for e in sse_events(resp)[:-1]]
    assert message["reasoning"] == message["reasoning_content"]  # vLLM's newer name
    for field in ("content", "reasoning_content", "reasoning"):
        assert "".join(d["delta"].get(field) or "" for d in deltas) == message[field]
    (streamed,) = [c for d in deltas for c in d["delta"].get("tool_calls") or []]
    assert streamed["function"] == call["function"] and deltas[-1]["finish_reason"] == "tool_calls"
    whole = post(handle, "/v1/chat/completions", {**body, "separate_reasoning": False}).json()["choices"][0]
    assert whole["message"]["content"].startswith("<think>") and whole["message"]["reasoning_content"] is None
    # the Responses API: a reasoning item, the message, a function_call item, streamed or not
    asked = {
        "input": "Time?",
        "tools": [{"type": "function", **tools[0]["function"]}],
        "regex": written,
        "max_output_tokens": 160,
        "temperature": 0,
    }
    response = post(handle, "/v1/responses", asked).json()
    reasoning, said, called = response["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": message["reasoning_content"]}]
    assert said["content"][0]["text"] == "It is late." and (called["name"], called["arguments"]) == (
        "get_time",
        '{"zone": "UTC"}',
    )
    assert 0 < response["usage"]["output_tokens_details"]["reasoning_tokens"] < response["usage"]["output_tokens"]
    with post(handle, "/v1/responses", {**asked, "stream": True}, stream=True) as resp:
        events = sse_events(resp)
    assert (
        "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
        == message["reasoning_content"]
    )
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "It is late."
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == [
        "reasoning",
        "message",
        "function_call",
    ]
