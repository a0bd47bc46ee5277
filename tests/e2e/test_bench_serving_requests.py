"""SGLang's load generator (`python -m sglang.bench_serving`, `sglang/benchmark/serving.py` in
0.5.23; `bench_serving.py` in 0.5.6) against a real `radixcluster up`: the released 0.5.6
module itself, run on its locally generated shared-prefix dataset (0.5.23's imports want
torchvision); and, for both versions, the exact bodies its request functions send, with its
default arguments, the streamed answers parsed the way it parses them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import requests

from support.api_helpers import TIMEOUT_S, get, post
from support.sglang_frontend import RUN_TIMEOUT_S, SEED_VERSION, sglang_env

pytestmark = pytest.mark.slow

PROMPT = "Write one sentence about the sea. " * 8
OUTPUT_LEN = 6


def _bench_lines(resp: requests.Response) -> list[bytes]:
    """What its ``async for chunk_bytes in response.content`` loop keeps: stripped, non-empty lines."""
    return [line.strip() for line in resp.iter_lines() if line.strip()]


def _stream(server, path: str, payload: dict[str, Any]) -> requests.Response:
    resp = requests.post(server.url + path, json=payload, headers=server.headers(), stream=True, timeout=TIMEOUT_S)
    assert resp.status_code == 200, resp.text
    return resp


def test_native_generate_request_as_bench_serving_sends_and_parses_it(server):
    # async_request_sglang_generate with bench_serving's defaults: no LoRA, no logprobs,
    # logprob_start_len -1, no routed experts, ignore_eos (the default without --disable-ignore-eos)
    payload = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": OUTPUT_LEN, "ignore_eos": True},
        "stream": True,
        "lora_path": None,
        "return_logprob": False,
        "return_routed_experts": False,
        "logprob_start_len": -1,
    }
    generated_text, output_len, last_output_len, chunks, prompt_len = "", OUTPUT_LEN, 0, 0, 0
    for chunk_bytes in _bench_lines(_stream(server, "/generate", payload)):
        sse_data = chunk_bytes[6:] if chunk_bytes.startswith(b"data: ") else chunk_bytes
        if sse_data == b"[DONE]":
            continue
        data = json.loads(sse_data)
        prompt_len = (data.get("usage") or data.get("meta_info") or {}).get("prompt_tokens") or prompt_len
        if "text" in data and data["text"]:
            generated_text = data["text"]
            output_len = data["meta_info"]["completion_tokens"]
            assert output_len >= last_output_len
            last_output_len = output_len
            chunks += 1
    assert generated_text
    assert output_len == OUTPUT_LEN  # ignore_eos: every requested token
    assert prompt_len > 0
    assert chunks >= 2  # streamed, not answered at once


def test_native_request_with_logprob_flags_of_its_command_line(server):
    # --return-logprob --top-logprobs-num 2 --logprob-start-len 0 (non-streamed: --disable-stream)
    payload = {
        "text": PROMPT,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True},
        "stream": False,
        "lora_path": None,
        "return_logprob": True,
        "return_routed_experts": False,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
    }
    resp = post(server, "/generate", payload)
    assert resp.status_code == 200, resp.text
    meta = resp.json()["meta_info"]
    assert len(meta["output_token_logprobs"]) == 3
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])


def test_openai_completions_request_as_bench_serving_sends_and_parses_it(server):
    model = get(server, "/v1/models").json()["data"][0]["id"]  # how it finds the model name
    payload = {
        "model": model,
        "prompt": PROMPT,
        "best_of": 1,
        "max_tokens": OUTPUT_LEN,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    generated_text, pieces = "", 0
    for chunk_bytes in _bench_lines(_stream(server, "/v1/completions", payload)):
        chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if data["choices"][0]["text"]:
            generated_text += data["choices"][0]["text"]
            pieces += 1
    assert generated_text and pieces >= 2


def test_openai_chat_request_as_bench_serving_sends_and_parses_it(server):
    model = get(server, "/v1/models").json()["data"][0]["id"]
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_completion_tokens": OUTPUT_LEN,
        "stream": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    generated_text, output_len = "", OUTPUT_LEN
    for chunk_bytes in _bench_lines(_stream(server, "/v1/chat/completions", payload)):
        chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        output_len = (data.get("usage") or {}).get("completion_tokens", output_len)
        choices = data.get("choices") or []
        if choices:
            delta = choices[0].get("delta") or {}
            generated_text += (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    assert generated_text
    assert output_len == OUTPUT_LEN


def test_its_readiness_model_and_server_info_calls(server):
    # wait_for_endpoint polls /v1/models for a 200; after the run it reads /server_info
    assert get(server, "/v1/models").status_code == 200
    info = get(server, "/server_info")
    assert info.status_code == 200
    # what bench_serving (avg_spec_accept_length, absent: no speculative decoding) and
    # bench_one_batch_server (which asserts the running-request bound) read from it
    (state,) = info.json()["internal_states"]
    assert state["effective_max_running_requests_per_dp"] == info.json()["max_running_requests"]
    assert state["memory_usage"]["token_capacity"] == info.json()["max_total_num_tokens"]
    assert state["last_gen_throughput"] >= 0 and "avg_spec_accept_length" not in state


def test_flush_cache_with_timeout_waits_for_running_requests(server):
    # flush_server_cache after warm-up: POST /flush_cache?timeout=60, raise_for_status()
    long_request = {"text": PROMPT, "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}, "stream": True}
    lines = (line.strip() for line in _stream(server, "/generate", long_request).iter_lines() if line.strip())
    first = next(lines)
    assert json.loads(first[6:])["meta_info"]["completion_tokens"] >= 1  # it is decoding now
    refused = requests.post(server.url + "/flush_cache", headers=server.headers(), timeout=TIMEOUT_S)
    assert refused.status_code == 400  # no timeout: refused while a request runs
    waited = requests.post(
        server.url + "/flush_cache", params={"timeout": 60.0}, headers=server.headers(), timeout=TIMEOUT_S
    )
    waited.raise_for_status()
    assert waited.json()["success"] is True
    rest = list(lines)
    assert rest[-1] == b"data: [DONE]"
    assert json.loads(rest[-2][6:])["meta_info"]["completion_tokens"] == 64  # not cut short
    # with --backend vllm it flushes through vLLM's endpoint: POST /reset_prefix_cache, raise_for_status()
    requests.post(server.url + "/reset_prefix_cache", headers=server.headers(), timeout=TIMEOUT_S).raise_for_status()


def test_the_released_bench_serving_runs_against_the_server(server, hf_tokenizer, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    hf_tokenizer.save_pretrained(tokenizer_dir)
    results = tmp_path / "results.jsonl"
    groups, per_group, output_len = 2, 3, 4
    command = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.url,
        "--tokenizer", str(tokenizer_dir), "--dataset-name", "generated-shared-prefix",
        "--gsp-num-groups", str(groups), "--gsp-prompts-per-group", str(per_group),
        "--gsp-system-prompt-len", "64", "--gsp-question-len", "16", "--gsp-output-len", str(output_len),
        "--output-file", str(results),
    ]  # fmt: skip
    env = {
        **sglang_env(SEED_VERSION),
        "HOME": str(tmp_path),  # its generated dataset is cached under ~/.cache
        "HF_HUB_OFFLINE": "1",
        "OPENAI_API_KEY": server.api_key or "",
    }
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(results.read_text().splitlines()[-1])
    assert result["completed"] == groups * per_group
    assert result["total_output_tokens"] == groups * per_group * output_len
