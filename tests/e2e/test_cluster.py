"""The serving cluster end to end: outputs equal transformers', with the radix cache off and
across 3 tensor-parallel ranks (which listen on loopback only and drain on Ctrl-C's SIGTERM to
their process group); concurrency; prefix reuse; shutdown leaves nothing behind."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
import requests
import torch

from radixcluster.process_tree import descendants, is_running
from support.api_helpers import TIMEOUT_S, assert_error, generate, get, post, sse_events
from support.listening import listeners
from support.profiles import trace_ops, wait_for_traces
from support.reference_prompts import SERVER_NEW_TOKENS, SERVER_PROMPTS
from support.servers import ServerHandle, free_port, launch_server, radixcluster_command
from support.streams import finished_normally, started_streams, wait_gone

pytestmark = pytest.mark.slow

PROMPTS = SERVER_PROMPTS
NEW_TOKENS = SERVER_NEW_TOKENS


def hf_greedy_ids(hf_tokenizer, hf_model, **generate: float) -> list[list[int]]:
    """transformers' greedy continuations of PROMPTS, tokenized by transformers."""
    outputs = []
    for prompt in PROMPTS:
        ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = hf_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, **generate)
        outputs.append(out[0, ids.shape[1] :].tolist())
    return outputs


@pytest.fixture(scope="module")
def reference(hf_tokenizer, hf_model) -> list[list[int]]:
    return hf_greedy_ids(hf_tokenizer, hf_model)


def greedy_ids(server, hf_tokenizer, **sampling: float) -> list[list[int]]:
    """Our greedy continuations of PROMPTS (sent as transformers' token ids: the reference
    compares the model, not two tokenizers)."""
    batch = {
        "input_ids": [hf_tokenizer(p).input_ids for p in PROMPTS],
        "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True, **sampling},
    }
    resp = post(server, "/generate", batch)
    assert resp.status_code == 200, resp.text
    return [item["output_ids"] for item in resp.json()]


def test_greedy_outputs_equal_transformers(server, hf_tokenizer, reference):
    assert greedy_ids(server, hf_tokenizer) == reference
    # and again, now that every prompt is cached
    assert greedy_ids(server, hf_tokenizer) == reference


def test_repetition_penalty_outputs_equal_transformers(server, hf_tokenizer, hf_model):
    # the penalty covers the prompt's tokens from the first output token on, as transformers' does
    penalized = hf_greedy_ids(hf_tokenizer, hf_model, repetition_penalty=1.3)
    assert penalized != hf_greedy_ids(hf_tokenizer, hf_model)
    assert greedy_ids(server, hf_tokenizer, repetition_penalty=1.3) == penalized


@pytest.fixture(scope="module")
def tp3() -> Iterator[ServerHandle]:
    """A --tp-size 3 server with pages of 16 tokens; the drain test below stops it."""
    with launch_server("--tp-size", "3", "--page-size", "16", "--shutdown-timeout", "120") as handle:
        yield handle


def test_radix_off_and_tensor_parallel_3_give_the_same_outputs(hf_tokenizer, reference, tp3):
    """Two servers at once on one host (their sockets and Ray instances must not collide)."""
    with launch_server("--disable-radix-cache") as off:
        assert greedy_ids(off, hf_tokenizer) == reference
        assert greedy_ids(tp3, hf_tokenizer) == reference
        assert get(off, "/cache_info").json()["cache_hits"] == 0
        # no cache to warm or pin: refused before anything is computed, as an evict is
        prefix = {"text": "You are a helpful assistant."}
        for route, body in (("/cache/warm", prefix), ("/cache/pin", {**prefix, "ttl_s": 60}), ("/cache/evict", prefix)):
            assert_error(post(off, route, body), 400, "radix cache is disabled")
        unpin = requests.delete(off.url + "/cache/pin", json=prefix, headers=off.headers(), timeout=TIMEOUT_S)
        assert_error(unpin, 400, "radix cache is disabled")
        assert get(tp3, "/get_server_info").json()["tp_size"] == 3


def test_an_fp8_kv_cache_holds_four_times_the_tokens_and_keeps_the_greedy_choices(server, hf_tokenizer, reference):
    """--kv-cache-dtype fp8_e4m3 on the float32 model: every position of the reference
    continuations asked once (prompt + the reference's tokens before it, one new token), so one
    early difference does not make every later position differ."""
    with launch_server("--kv-cache-dtype", "fp8_e4m3") as fp8:
        info, default = (get(s, "/get_server_info").json() for s in (fp8, server))
        assert (info["kv_cache_dtype"], default["kv_cache_dtype"]) == ("fp8_e4m3", "auto")
        assert info["max_total_num_tokens"] // 4 == default["max_total_num_tokens"]
        asked = [hf_tokenizer(p).input_ids + ref[:t] for p, ref in zip(PROMPTS, reference) for t in range(len(ref))]
        batch = {"input_ids": asked, "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True}}
        resp = post(fp8, "/generate", batch)
        assert resp.status_code == 200, resp.text
        chosen = [item["output_ids"][0] for item in resp.json()]
        expected = [token for ref in reference for token in ref]
        share = sum(c == e for c, e in zip(chosen, expected)) / len(expected)
        assert share >= 0.9, f"the fp8 cache's greedy choice is float32's at {share:.1%} of {len(expected)} positions"


def test_shared_prefix_is_reused_page_aligned_and_flushed(tp3):
    """On the tp 3 server, whose pages hold 16 tokens."""
    prefix = " ".join(f"word{i}" for i in range(250))  # ~500 tokens
    first = generate(tp3, prefix + " First question?", max_new_tokens=4)
    before = get(tp3, "/cache_info").json()
    second = generate(tp3, prefix + " Second one?", max_new_tokens=4)
    after = get(tp3, "/cache_info").json()
    shared = first["meta_info"]["prompt_tokens"] - 4  # the questions differ in their last few tokens
    assert second["meta_info"]["cached_tokens"] >= (shared // 16) * 16 - 16
    assert second["meta_info"]["cached_tokens"] % 16 == 0
    assert after["cache_hits"] == before["cache_hits"] + 1
    assert after["cached_tokens_total"] == before["cached_tokens_total"] + second["meta_info"]["cached_tokens"]
    assert post(tp3, "/flush_cache", {}).status_code == 200
    assert generate(tp3, prefix + " Second one?", max_new_tokens=4)["meta_info"]["cached_tokens"] == 0


def test_every_rank_of_tp3_writes_its_profile(tp3, tmp_path):
    assert post(tp3, "/start_profile", {"output_dir": str(tmp_path), "profile_id": "tp3"}).status_code == 200
    generate(tp3, "Profiled on three ranks.", max_new_tokens=3)
    assert post(tp3, "/stop_profile", {}).status_code == 200
    traces = wait_for_traces(tmp_path, "tp3-TP-*.trace.json.gz", 3)
    assert [t.name for t in traces] == [f"tp3-TP-{rank}.trace.json.gz" for rank in range(3)]
    assert all(any(op.startswith("aten::") for op in trace_ops(t)) for t in traces)


def test_tp3_listens_on_loopback_only_and_drains_on_sigterm_to_its_process_group(tp3):
    tree = descendants(tp3.process.pid)
    open_ports = listeners(tree)
    commands = {x.command for x in open_ports}
    assert {"gcs_server", "raylet"} <= commands, commands  # Ray's services are among them
    assert len([x for x in open_ports if x.command.startswith("ray::TPWorker")]) >= 3  # gloo / the store
    assert [x for x in open_ports if not x.loopback_only] == []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        running = started_streams(tp3, pool, [4, 4, 4, 4])
        os.killpg(tp3.process.pid, signal.SIGTERM)  # as Ctrl-C would: everyone in the group
        assert all(finished_normally(f.result()) for f in running)
    assert tp3.process.wait(timeout=120) == 0
    assert wait_gone(tree, 10) == set()


def stream_text(server, prompt: str) -> str:
    body = {
        "text": prompt,
        "stream": True,
        "sampling_params": {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True},
    }
    events = sse_events(post(server, "/generate", body, stream=True))
    assert events[-1] == "[DONE]"
    assert events[-2]["meta_info"]["completion_tokens"] == 8
    return events[-2]["text"]


def test_32_concurrent_streams_equal_their_outputs_alone(server):
    prompts = [f"Request {i}: tell me about the number {i * 7}." for i in range(32)]
    alone = [stream_text(server, p) for p in prompts]
    assert post(server, "/flush_cache", {}).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: stream_text(server, p), prompts))
    assert together == alone
    info = get(server, "/cache_info").json()
    assert info["protected_tokens"] == 0  # nothing left locked once every stream ended


def test_sigterm_during_load_leaves_no_process_behind():
    cmd = [*radixcluster_command(), "up", "--port", str(free_port())]
    process = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(seen) < 4:  # Ray's processes and the workers are starting
        seen |= descendants(process.pid)
        time.sleep(0.5)
    assert seen, "radixcluster up started no processes"
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("radixcluster up did not exit within 90 s of SIGTERM")
    assert process.returncode == 0, process.communicate()[1].decode()[-2000:]
    time.sleep(2)
    left = {pid for pid in seen if is_running(pid)}
    assert left == set(), f"left behind: {left}"
