"""The router's request handling on the real tokenizer, scheduler and model runner, in one
process (the sockets around it are exercised by the end-to-end tests): outputs, prefix reuse,
rejections, and that no request, however malformed, and no failing step can stop it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import re
import threading

import msgpack
import numpy as np
import pytest
import torch
import zmq

from radixcluster.block_hash import prefix_block_hashes
from radixcluster.protocol import (
    STEP_OVERDUE_S,
    AbortRequest,
    ControlRequest,
    ForwardBatch,
    GenerateRequest,
    RankFailed,
    RequestOutput,
    SamplingParams,
    StepResult,
    encode,
)
from radixcluster.router.router_process import MAX_LOSSES_PER_REQUEST, Router, RouterConfig
from radixcluster.router.router_sockets import GroupLost, LauncherSpoke, RouterAddresses, RouterSockets
from radixcluster.router.tree_events import TreeEventLog
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from support.router_configs import in_process_router_config

PAGES = 4096
_rids = itertools.count()


@pytest.fixture(scope="module")
def runner(model_path) -> ModelRunner:
    return ModelRunner(
        RunnerConfig(model_path=model_path, num_pages=PAGES, page_size=1, max_slots=8, max_context_len=8192)
    )


def router_config(model_path, **overrides) -> RouterConfig:
    limits = dict(
        num_pages=PAGES,
        context_length=8192,
        max_running_requests=8,
        chunked_prefill_size=64,
        max_queued_requests=64,
    )
    return in_process_router_config(model_path, **{**limits, **overrides})


@pytest.fixture()
def config(model_path) -> RouterConfig:
    return router_config(model_path)


@pytest.fixture()
def router(config) -> Router:
    return Router(config)


def request(text: str | None = None, **kw) -> GenerateRequest:
    sampling = kw.pop("sampling", {})
    sampling.setdefault("temperature", 0.0)
    return GenerateRequest(rid=f"r{next(_rids)}", text=text, sampling=SamplingParams(**sampling), **kw)


def run(router: Router, runner: ModelRunner, *reqs: GenerateRequest) -> dict[str, list[RequestOutput]]:
    """Submit ``reqs`` and step until each has its last output; outputs by rid."""
    outputs: dict[str, list[RequestOutput]] = {r.rid: [] for r in reqs}
    for r in reqs:
        for out in router.submit(r):
            outputs[out.rid].append(out)
    return drive(router, runner, outputs)


def drive(
    router: Router, runner: ModelRunner, outputs: dict[str, list[RequestOutput]]
) -> dict[str, list[RequestOutput]]:
    """Step until every request in ``outputs`` has its last output (collected there)."""
    while not all(outs and outs[-1].finished for outs in outputs.values()):
        for out in router.step(runner.step):
            outputs[out.rid].append(out)
    router.scheduler.check_integrity()
    return outputs


def test_greedy_output_equals_transformers(router, runner, hf_tokenizer, hf_model):
    prompt = "The capital of France is"
    out = run(router, runner, request(prompt, sampling={"max_new_tokens": 12, "ignore_eos": True}))
    (last,) = out[next(iter(out))]
    ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = hf_model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)[0, ids.shape[1] :]
    assert last.output_ids == ref.tolist()
    assert last.text == hf_tokenizer.decode(ref, skip_special_tokens=True)
    assert (last.prompt_tokens, last.completion_tokens) == (ids.shape[1], 12)


def test_stream_deltas_concatenate_to_the_whole_and_a_stop_string_trims(router, runner):
    prompt = "Write the numbers from one to twenty in words:"
    whole = run(router, runner, request(prompt, sampling={"max_new_tokens": 24, "ignore_eos": True}))
    text = next(iter(whole.values()))[-1].text
    streamed = run(router, runner, request(prompt, stream=True, sampling={"max_new_tokens": 24, "ignore_eos": True}))
    deltas = next(iter(streamed.values()))
    assert len(deltas) > 1 and "".join(d.text for d in deltas) == text
    stop = text[8:12]
    stopped = run(router, runner, request(prompt, sampling={"max_new_tokens": 24, "stop": [stop]}))
    last = next(iter(stopped.values()))[-1]
    assert last.text == text[: text.index(stop)]
    assert last.finish_reason == {"type": "stop", "matched": stop}


def test_log_requests_logs_each_request_queued_and_ended_without_its_text(model_path, runner, caplog):
    """--log-requests: a line when a request is queued and one when it ends, whatever the log
    level; the prompt's and answer's text never; none of it without the flag, nor for the
    server's own probe."""
    prompt = "A secret the log must not show: swordfish. The capital of France is"
    with caplog.at_level(logging.DEBUG, logger="radixcluster.requests"):
        quiet = Router(router_config(model_path))
        run(quiet, runner, request(prompt, sampling={"max_new_tokens": 3, "ignore_eos": True}))
        assert not [r for r in caplog.records if r.name == "radixcluster.requests"]
    logging.getLogger().setLevel(logging.WARNING)  # the server's default level
    logged = Router(router_config(model_path, log_requests=True))
    ran = run(logged, runner, request(prompt, sampling={"max_new_tokens": 3, "ignore_eos": True}))
    run(logged, runner, request(prompt, sampling={"max_new_tokens": 10_000}))  # past the context: a 400
    run(logged, runner, request(prompt, sampling={"max_new_tokens": 1}, log_metrics=False))  # /health_generate's
    (last,) = [outs[-1] for outs in ran.values()]
    lines = [r.getMessage() for r in caplog.records if r.name == "radixcluster.requests"]
    assert len(lines) == 3
    assert re.fullmatch(
        rf"request {last.rid} queued: {last.prompt_tokens} prompt tokens, max_new_tokens 3, .*", lines[0]
    )
    assert re.fullmatch(
        rf"request {last.rid} ended \(length\): {last.prompt_tokens} prompt tokens, .*3 generated, [0-9.]+ s", lines[1]
    )
    assert re.fullmatch(r"request r\d+ failed \(400\): .*", lines[2])
    assert not any("swordfish" in line or last.text in line for line in lines)
    # a client's request id cannot forge a line of its own
    forged = dataclasses.replace(request(prompt, sampling={"max_new_tokens": 1}), rid="x\nrequest y ended\x07\u2028")
    run(logged, runner, forged)
    lines = [r.getMessage() for r in caplog.records if r.name == "radixcluster.requests"][3:]
    assert len(lines) == 2 and all(line.startswith("request x\\x0arequest y ended\\x07\\u2028 ") for line in lines)


def test_decode_log_interval_logs_the_batch_every_that_many_decode_steps(model_path, runner, caplog):
    router = Router(router_config(model_path, decode_log_interval=2))
    with caplog.at_level(logging.INFO, logger="radixcluster.router.decode_log"):
        run(
            router,
            runner,
            *(request("Count: one, two,", sampling={"max_new_tokens": 5, "ignore_eos": True}) for _ in "ab"),
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "radixcluster.router.decode_log"]
    # the first token of each comes from its prefill; the other four from four decode steps
    assert len(lines) == 2
    for line in lines:
        assert re.fullmatch(
            r"decode: a batch of 2, 0 queued, KV pool \d+\.\d% used, [\d.]+ tokens/s decoded over the last 2 steps",
            line,
        )
    # SGLang's last_gen_throughput: the last interval's rate, until it is stale
    (state,) = router.submit(ControlRequest(cid="i", kind="server_info"))[0].payload["internal_states"]
    assert state["last_gen_throughput"] == round(router.decode_log.gen_throughput(), 2) > 0
    # and /metrics' gen_throughput (sglang:gen_throughput)
    stats = router.submit(ControlRequest(cid="s", kind="stats"))[0].payload
    assert stats["gen_throughput"] == router.decode_log.gen_throughput()


def test_each_prefill_step_logs_sglangs_line_with_the_cached_tokens(router, runner, caplog):
    """The line users grep for the cache at work (SGLang's "Prefill batch. ... #cached-token")."""
    header = "You are a careful assistant. Answer briefly and precisely. " * 4
    with caplog.at_level(logging.INFO, logger="radixcluster.router.prefill_log"):
        first = next(iter(run(router, runner, request(header + "What is 2+2?")).values()))[-1]
        second = next(iter(run(router, runner, request(header + "What is 3+3?")).values()))[-1]
    lines = [r.getMessage() for r in caplog.records if r.name == "radixcluster.router.prefill_log"]
    pattern = r"Prefill batch\. #new-seq: 1, #new-token: (\d+), #cached-token: (\d+), token usage: \d\.\d\d, #running-req: 0, #queue-req: 0"
    counts = [tuple(map(int, re.fullmatch(pattern, line).groups())) for line in lines]
    assert (
        counts
        == [
            (first.prompt_tokens, 0),
            (second.prompt_tokens - second.cached_tokens, second.cached_tokens),
        ]
        and second.cached_tokens > 0
    )


def test_a_chunked_prompts_later_chunks_log_as_sglang_counts_them(router, runner, caplog):
    """Chunks of 64: each step's line counts the request being prefilled (SGLang's #new-seq
    counts a chunked request in every step) and its cache hit only in its first."""
    with caplog.at_level(logging.INFO, logger="radixcluster.router.prefill_log"):
        (outs,) = run(router, runner, request("Count the words of this sentence with care. " * 15)).values()
    lines = [r.getMessage() for r in caplog.records if r.name == "radixcluster.router.prefill_log"]
    pattern = r"Prefill batch\. #new-seq: 1, #new-token: (\d+), #cached-token: 0, .*"
    assert len(lines) > 1 and sum(int(re.fullmatch(pattern, line).group(1)) for line in lines) == outs[-1].prompt_tokens


def test_a_stream_interval_sends_the_first_token_then_that_many_at_a_time(model_path, runner):
    """--stream-interval 4: a streaming request's outputs carry 1, 4, 4, ... tokens and the
    rest at the end, spelling what the interval of 1 spells; a non-streaming one is unchanged;
    a request's own stream_interval overrides the server's (SGLang's sampling field)."""
    interval = Router(router_config(model_path, stream_interval=4))
    sampling = {"max_new_tokens": 11, "ignore_eos": True}
    prompt = "Write the numbers from one to twenty in words:"
    default = Router(router_config(model_path))
    (every,) = run(default, runner, request(prompt, stream=True, sampling=dict(sampling))).values()
    (own,) = run(default, runner, request(prompt, stream=True, sampling={**sampling, "stream_interval": 3})).values()
    assert [len(d.output_ids) for d in own] == [1, 3, 3, 3, 1]
    (lower,) = run(interval, runner, request(prompt, stream=True, sampling={**sampling, "stream_interval": 1})).values()
    assert [len(d.output_ids) for d in lower] == [1] * 11
    (grouped,) = run(interval, runner, request(prompt, stream=True, sampling=dict(sampling))).values()
    ids = [t for d in every for t in d.output_ids]
    assert [len(d.output_ids) for d in every] == [1] * 11
    assert [len(d.output_ids) for d in grouped] == [1, 4, 4, 2]
    assert [t for d in grouped for t in d.output_ids] == ids
    assert "".join(d.text for d in grouped) == "".join(d.text for d in every)
    assert [d.completion_tokens for d in grouped] == [1, 5, 9, 11] and grouped[-1].finished
    (whole,) = run(interval, runner, request(prompt, sampling=dict(sampling))).values()
    assert len(whole) == 1 and whole[0].output_ids == ids


def test_the_second_request_reuses_the_first_ones_prefix(router, runner):
    header = "You are a careful assistant. Answer briefly and precisely. " * 6
    first = run(router, runner, request(header + "What is 2+2?", sampling={"max_new_tokens": 2}))
    second = run(router, runner, request(header + "What is 3+3?", sampling={"max_new_tokens": 2}))
    shared = next(iter(first.values()))[-1].prompt_tokens - 6
    assert next(iter(second.values()))[-1].cached_tokens >= shared
    info = router.submit(ControlRequest(cid="c", kind="cache_info"))[0].payload
    assert info["cache_hits"] == 1 and info["total_requests"] == 2 and info["hit_rate"] == 0.5
    assert 0 < info["token_hit_rate"] < 1


@pytest.mark.parametrize(
    "msg, words",
    [
        (GenerateRequest(rid="e", sampling=SamplingParams(), text=""), "empty"),
        (GenerateRequest(rid="l", sampling=SamplingParams(), input_ids=[5] * 9000), "context length"),
        (GenerateRequest(rid="v", sampling=SamplingParams(), input_ids=[5, 49152]), "49152"),
        (GenerateRequest(rid="m", sampling=SamplingParams(), messages=[{"role": "robot", "content": "x"}]), "role"),
    ],
)
def test_requests_that_cannot_run_are_rejected_with_a_reason(router, msg, words):
    (out,) = router.submit(msg)
    assert out.status == 400 and out.finished and words in out.error
    assert router.idle()


def test_abort_mid_generation_releases_everything(router, runner):
    msg = request("Count slowly:", stream=True, sampling={"max_new_tokens": 200, "ignore_eos": True})
    router.submit(msg)
    for _ in range(3):
        router.step(runner.step)
    (last,) = router.submit(AbortRequest(rid=msg.rid))  # the caller, if waiting, learns why it ended
    assert last.finished and last.finish_reason["type"] == "abort" and last.error is None
    assert router.step(runner.step) == [] and router.idle()
    router.scheduler.check_integrity()
    stats = router.submit(ControlRequest(cid="s", kind="stats"))[0].payload
    assert stats["running_requests"] == 0 and stats["free_pages"] + stats["evictable_tokens"] == PAGES


def test_batched_prompt_logprobs_equal_the_reference(router, runner, hf_tokenizer, hf_model):
    texts = ["Hello world, this is a test of it", "Hello world, this is a test of the system ok"]
    reqs = [request(t, return_logprob=True, logprob_start_len=3, sampling={"max_new_tokens": 0}) for t in texts]
    outs = run(router, runner, *reqs)
    for text, r in zip(texts, reqs):
        got = outs[r.rid][-1].input_logprobs
        ids = hf_tokenizer(text, return_tensors="pt").input_ids
        with torch.inference_mode():
            logp = torch.log_softmax(hf_model(ids).logits[0].float(), -1)
        expected = [logp[p - 1, ids[0, p]].item() for p in range(4, ids.shape[1])]
        assert got[0] == [None, ids[0, 3].item()]
        assert [tok for _, tok in got[1:]] == ids[0, 4:].tolist()
        np.testing.assert_allclose([lp for lp, _ in got[1:]], expected, rtol=1e-4, atol=1e-4)


def test_prompt_top_logprobs_equal_the_reference(router, runner, hf_tokenizer, hf_model):
    text = "Hello world, this is a test of the top logprobs of a prompt"
    msg = request(text, return_logprob=True, logprob_start_len=2, top_logprobs_num=3, sampling={"max_new_tokens": 1})
    (last,) = run(router, runner, msg)[msg.rid]
    ids = hf_tokenizer(text, return_tensors="pt").input_ids
    with torch.inference_mode():
        logp = torch.log_softmax(hf_model(ids).logits[0].float(), -1)
    tops = last.input_top_logprobs
    assert len(tops) == len(last.input_logprobs) == ids.shape[1] - 2 and tops[0] is None
    for position, top in enumerate(tops[1:], start=2):
        values, top_ids = logp[position].topk(3)
        assert [t for _, t in top] == top_ids.tolist()
        np.testing.assert_allclose([v for v, _ in top], values.tolist(), rtol=1e-4, atol=1e-4)


def test_the_next_chat_turn_reuses_the_sampled_answer_ids(router, runner, config):
    """Sampled text need not re-encode to the ids that produced it; the next turn must still
    hit the whole previous prompt + answer."""
    first_turn = [{"role": "user", "content": "写一首关于大海的短诗。"}]
    sampling = {"temperature": 1.0, "seed": 8, "max_new_tokens": 40}  # its answer re-encodes differently from token 14
    first = request(messages=first_turn, sampling=dict(sampling))
    answer = run(router, runner, first)[first.rid][-1]
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": answer.text},
        {"role": "user", "content": "再写一首。"},
    ]
    second = request(messages=second_turn, sampling=dict(sampling))
    reply = run(router, runner, second)[second.rid][-1]
    answer_ids = [t for t in answer.output_ids if t not in router.tokenizer.eos_token_ids]
    assert reply.cached_tokens >= answer.prompt_tokens + len(answer_ids) - 1
    # /tokenize (and the count endpoints) count the prompt the chat runs; a flush forgets the
    # answers, and the server then tokenizes as a fresh one
    run_ids = router.intake.make_request(second)[0].prompt_ids.tolist()
    assert tokenize(router, second_turn) == run_ids
    assert router.submit(ControlRequest(cid="f", kind="flush_cache"))[0].payload["success"]
    fresh = Router(config).intake.make_request(second)[0].prompt_ids.tolist()
    assert tokenize(router, second_turn) == fresh != run_ids


def tokenize(router: Router, messages: list[dict]) -> list[int]:
    args = {"messages": messages, "add_generation_prompt": True}
    return router.submit(ControlRequest(cid="t", kind="tokenize", args=args))[0].payload["tokens"][0]


def test_abort_all_ends_every_request(router, runner):
    msgs = [request(f"Count to {n}:", sampling={"max_new_tokens": 100, "ignore_eos": True}) for n in (3, 4)]
    for msg in msgs:
        router.submit(msg)
    router.step(runner.step)
    outs = router.submit(AbortRequest(rid="", abort_all=True))
    assert sorted(o.rid for o in outs) == sorted(m.rid for m in msgs)
    assert all(o.finish_reason["type"] == "abort" for o in outs) and router.idle()
    router.scheduler.check_integrity()


def test_stop_regex_ends_the_text_after_its_match(router, runner):
    prompt = "Write the numbers from one to twenty in words:"
    whole = run(router, runner, request(prompt, sampling={"max_new_tokens": 24, "ignore_eos": True}))
    text = next(iter(whole.values()))[-1].text
    piece = text[8:12]
    pattern = re.escape(piece)
    stopped = run(router, runner, request(prompt, sampling={"max_new_tokens": 24, "stop_regex": [pattern]}))
    last = next(iter(stopped.values()))[-1]
    assert last.text == text[: text.index(piece) + len(piece)]  # the match is kept
    assert last.finish_reason == {"type": "stop", "matched": pattern}


def test_logprob_entries_get_each_tokens_own_text(router, runner):
    msg = request(
        "<|im_start|>user\nHi<|im_end|>\n",
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=0,
        return_text_in_logprobs=True,
        sampling={"max_new_tokens": 3},
    )
    (last,) = run(router, runner, msg)[msg.rid]
    ids = [tid for _, tid in last.input_logprobs] + [tid for _, tid, _ in last.output_logprobs]
    ids += [tid for _, _, tops in last.output_logprobs for _, tid in tops]
    ids += [tid for tops in last.input_top_logprobs if tops for _, tid in tops]
    assert set(last.token_texts) == set(ids)
    for tid, text in last.token_texts.items():
        assert text == router.tokenizer.decode([tid], skip_special_tokens=False)
    assert last.token_texts[last.input_logprobs[0][1]] == "<|im_start|>"  # special tokens spelled out
    plain = request("Hi", return_logprob=True, sampling={"max_new_tokens": 2})
    assert run(router, runner, plain)[plain.rid][-1].token_texts == {}


def test_tokenize_and_detokenize_round_trip(router):
    def control(kind, **args):
        return router.submit(ControlRequest(cid="t", kind=kind, args=args))[0]

    (ids,) = control("tokenize", prompts=["你好, world"], add_special_tokens=True).payload["tokens"]
    assert ids == router.tokenizer.encode("你好, world")
    assert control("detokenize", tokens=[ids]).payload["texts"] == ["你好, world"]
    chat = control("tokenize", messages=[{"role": "user", "content": "Hi"}]).payload["tokens"][0]
    assert router.tokenizer.decode(chat, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert "49152" in control("detokenize", tokens=[[1, 49152]]).error
    assert "role" in control("tokenize", messages=[{"role": "robot", "content": "x"}]).error
    # a chat's template variables reach the template (SmolLM2's reads none of them)
    hi = [{"role": "user", "content": "Hi"}]
    assert control("tokenize", messages=hi, chat_template_kwargs={"enable_thinking": False}).payload["tokens"] == [chat]
    assert "may not set messages" in control("tokenize", messages=hi, chat_template_kwargs={"messages": []}).error


def test_tree_events_let_a_gateway_predict_the_cached_tokens(model_path, runner):
    """The events a router publishes, replayed, equal its snapshot, and matching a new prompt's
    block names against them predicts exactly the cached tokens the router then reports."""
    config = router_config(model_path, num_pages=256, page_size=4)
    router = Router(config, TreeEventLog(4))
    events = router.tree_events
    view: set[int] = set()

    def replay() -> None:
        for event in events.drain():
            names = set(event.blocks.tolist())
            if event.kind == "insert":
                view.update(names)
            else:
                view.difference_update(names)

    header = "You are a careful assistant. Answer briefly and precisely. " * 4
    run(router, runner, request(header + "What is 2+2?", sampling={"max_new_tokens": 3}))
    replay()
    snapshot = router.submit(ControlRequest(cid="b", kind="cache_blocks"))[0].payload
    assert set(snapshot["blocks"].tolist()) == view and snapshot["seq"] == events.seq > 0
    second = request(header + "What is 3+3?", sampling={"max_new_tokens": 3})
    ids = router.tokenizer.encode(second.text)
    names = prefix_block_hashes(np.asarray(ids), 4, None)[: (len(ids) - 1) // 4]
    predicted = 4 * next((i for i, n in enumerate(names.tolist()) if n not in view), len(names))
    assert predicted > 0
    assert run(router, runner, second)[second.rid][-1].cached_tokens == predicted
    stats = router.submit(ControlRequest(cid="s", kind="stats"))[0].payload
    assert (stats["tree_events_instance"], stats["prefilling_tokens"], stats["waiting_tokens"]) == (
        events.instance,
        0,
        0,
    )
    assert router.submit(ControlRequest(cid="f", kind="flush_cache"))[0].payload["success"]
    replay()
    assert view == set()


def stats(router: Router) -> dict:
    return router.submit(ControlRequest(cid="s", kind="stats"))[0].payload


def assert_serves(router: Router, runner: ModelRunner) -> None:
    """A plain request still gets its tokens, and the pool is whole afterwards."""
    msg = request("Still there?", sampling={"max_new_tokens": 3, "ignore_eos": True})
    assert run(router, runner, msg)[msg.rid][-1].completion_tokens == 3
    after = stats(router)
    assert after["running_requests"] == after["waiting_requests"] == 0
    assert after["free_pages"] + after["evictable_tokens"] == after["num_pages"]


BIG = 2**63


@pytest.mark.parametrize(
    "msg, words",
    [
        (GenerateRequest(rid="i", sampling=SamplingParams(), input_ids=[1, BIG]), "input_ids"),
        (GenerateRequest(rid="i2", sampling=SamplingParams(), input_ids=[1, 2**64 + 5]), "input_ids"),
        (GenerateRequest(rid="t", sampling=SamplingParams(stop_token_ids=[BIG]), text="hi"), "stop_token_ids"),
        (GenerateRequest(rid="s", sampling=SamplingParams(seed=BIG), text="hi"), "seed"),
        (GenerateRequest(rid="k", sampling=SamplingParams(top_k=BIG), text="hi"), "top_k"),
        (GenerateRequest(rid="n", sampling=SamplingParams(max_new_tokens=BIG), text="hi"), "max_new_tokens"),
        (GenerateRequest(rid="c", sampling=SamplingParams(max_new_tokens=8191), text="Hello there"), "context length"),
    ],
)
def test_values_beyond_what_the_arrays_hold_are_refused_and_the_router_serves_on(router, runner, msg, words):
    """What the api bounds, the router checks again: a message from any other client must not
    crash the loop (an OverflowError in the intake or a step later in the batch builder)."""
    (out,) = router.submit(msg)
    assert out.status == 400 and out.finished and words in out.error
    assert_serves(router, runner)


def from_the_future(msg: object) -> bytes:
    """``msg``'s frame with a field this version does not know (an api of a later version)."""
    version, name, fields = msgpack.unpackb(encode(msg))
    return msgpack.packb([version, name, {**fields, "from_the_future": 1}])


def test_a_frame_the_router_cannot_read_is_answered_when_it_names_its_caller(router):
    """Its caller gets an error instead of waiting for ever."""
    unread, read = request("hi"), request("hi")
    (out,) = router.submit_frame(from_the_future(unread))
    assert out.rid == unread.rid and out.status == 500 and "from_the_future" in out.error
    (answer,) = router.submit_frame(from_the_future(ControlRequest(cid="c1", kind="stats")))
    assert answer.cid == "c1" and "could not read" in answer.error
    assert router.submit_frame(b"garbage") == []
    assert router.submit_frame(encode(read)) == [] and read.rid in router.streams


def test_a_request_larger_than_the_kv_pool_is_refused(config):
    """A pool smaller than the context (a small host, or --max-total-tokens): a request that
    could never fit is a 400, not a ValueError out of the scheduler."""
    router = Router(dataclasses.replace(config, num_pages=1000))
    (out,) = router.submit(request(input_ids=[5] * 10, sampling={"max_new_tokens": 991}))
    assert out.status == 400 and "KV pool of 1000 tokens" in out.error
    assert router.submit(request(input_ids=[5] * 10, sampling={"max_new_tokens": 990})) == []


def test_a_failing_step_fails_its_batch_and_the_router_serves_on(router, runner):
    doomed = [request(f"Doomed {i}:", stream=True, sampling={"max_new_tokens": 50}) for i in range(2)]
    for msg in doomed:
        router.submit(msg)
    router.step(runner.step)  # their prefill

    def broken(batch: ForwardBatch) -> StepResult:
        raise RuntimeError("the executor broke")

    outputs = router.step(broken)
    assert sorted(out.rid for out in outputs) == sorted(msg.rid for msg in doomed)
    assert all(out.status == 500 and out.finished for out in outputs)
    assert all("the executor broke" not in out.error for out in outputs)  # internals stay in the log
    assert stats(router)["aborted_requests_total"] == 2
    assert_serves(router, runner)


def test_a_lost_group_requeues_its_requests_and_they_go_on_with_the_same_tokens(router, runner):
    """The router's half of a replaced TP group: mid-decode the group is lost; its requests go
    back to the queue with what they streamed, the tree empties, nothing steps until the new
    group serves, and then each request recomputes its tokens and ends exactly as an undisturbed
    run does: no token repeated, none changed."""
    texts = [f"Tell me about the number {i}." for i in range(3)]
    greedy = {"max_new_tokens": 20, "ignore_eos": True}
    undisturbed = run(router, runner, *(request(t, sampling=dict(greedy)) for t in texts))
    expected = sorted(outs[-1].output_ids for outs in undisturbed.values())

    reqs = [request(t, stream=True, sampling=dict(greedy)) for t in texts]
    outputs: dict[str, list[RequestOutput]] = {r.rid: [] for r in reqs}
    for r in reqs:
        router.submit(r)
    for _ in range(6):  # prefill and a few decodes
        for out in router.step(runner.step):
            outputs[out.rid].append(out)
    assert router.lose_group(0, "rank 1 died") == []
    assert router.lose_group(0, "rank 1 died") is None  # the launcher's word on the same loss
    stats = router.submit(ControlRequest(cid="s", kind="stats"))[0].payload
    assert stats["group_up"] == 0 and stats["requeued_requests_total"] == 3 and stats["cached_tokens"] == 0
    (health,) = router.submit(ControlRequest(cid="h", kind="health"))
    assert "restarting (rank 1 died)" in health.error
    router.group_restored(1)
    drive(router, runner, outputs)
    streamed = sorted([tok for out in outs for tok in out.output_ids] for outs in outputs.values())
    assert streamed == expected
    stats = router.submit(ControlRequest(cid="s", kind="stats"))[0].payload
    assert (stats["group_up"], stats["worker_restarts_total"]) == (1, 1) and stats["seconds_without_group_total"] > 0
    assert router.submit(ControlRequest(cid="h", kind="health"))[0].payload == {"generation": 1}


def test_a_request_in_flight_at_every_loss_ends_with_an_error_and_a_full_queue_says_503(config, runner):
    """A request that was running each time the group was lost may be what kills it: after
    MAX_LOSSES_PER_REQUEST losses it ends with a 500 instead of going round again. While no
    group serves, a full queue answers 503 (Retry-After) rather than 429."""
    router = Router(dataclasses.replace(config, max_queued_requests=1))
    suspect = request("Suspect:", stream=True, sampling={"max_new_tokens": 50})
    router.submit(suspect)
    for generation in range(MAX_LOSSES_PER_REQUEST):
        router.step(runner.step)
        outputs = router.lose_group(generation, "rank 0 failed in step 1: RuntimeError: boom")
        router.group_restored(generation + 1)
    (out,) = outputs
    assert out.rid == suspect.rid and out.status == 500 and "failed 2 times while running" in out.error
    router.submit(request("Queued"))
    router.lose_group(MAX_LOSSES_PER_REQUEST, "rank 2 died")
    (refused,) = router.submit(request("One too many"))
    assert refused.status == 503 and "restarting (rank 2 died)" in refused.error


def test_a_step_ends_with_its_result_a_rank_failure_the_timeout_or_the_launcher(router, tmp_path):
    """The remote executor on real sockets, with a silent rank 0 behind them: a late result of an
    earlier step is skipped, a rank's RankFailed and the step timeout are a lost group (not a
    failed batch: the router lets them through), and a word on the control pipe interrupts,
    even a send that no rank 0 takes."""
    addresses = RouterAddresses(*(f"ipc://{tmp_path}/{name}" for name in ("in", "out", "batch", "result")))
    read_end, write_end = os.pipe()
    sockets = RouterSockets(addresses, step_timeout_s=0.2, interrupt_fd=read_end)
    rank_in, rank_out = sockets.ctx.socket(zmq.PULL), sockets.ctx.socket(zmq.PUSH)
    rank_in.connect(addresses.batch)
    rank_out.connect(addresses.result)
    generations = itertools.count(1)

    def lost_step() -> None:
        router.submit(request("Lost:", sampling={"max_new_tokens": 4}))
        try:
            router.step(sockets.execute)
        finally:  # what run_router does next: re-queue, and carry on once a new group serves
            router.lose_group(router.group.generation, "lost in this test")
            router.group_restored(next(generations))
            router.abort_all("next case")

    try:
        rank_out.send(encode(StepResult(step_id=0, next_token_ids=np.zeros(1, np.int32))))  # late, skipped
        rank_out.send(encode(RankFailed(rank=2, step_id=1, error="RuntimeError: boom")))
        with pytest.raises(GroupLost, match=r"rank 2 failed in step 1: RuntimeError: boom"):
            lost_step()
        with pytest.raises(GroupLost, match=r"got no result within --step-timeout 0.2 s"):
            lost_step()
        os.write(write_end, b"x")
        with pytest.raises(LauncherSpoke):
            lost_step()
        rank_in.close(linger=0)  # no rank 0 at all: the send itself waits, and is interrupted
        with pytest.raises(LauncherSpoke):
            lost_step()
    finally:
        rank_out.close(linger=0)
        sockets.ctx.destroy(linger=0)
        os.close(read_end)
        os.close(write_end)


def test_questions_that_read_state_are_answered_while_a_step_runs(router, tmp_path):
    """A step that gets no result (a stopped rank) held every question until --step-timeout:
    /metrics and /cache_info could not be read then. The api's messages that come during a step
    reach while_stepping; the router answers those that read what stands still, and /health
    fails once the step is overdue."""
    addresses = RouterAddresses(*(f"ipc://{tmp_path}/{name}" for name in ("in", "out", "batch", "result")))
    heard: list[tuple[bytes, float]] = []
    sockets = RouterSockets(addresses, 1.0, while_stepping=lambda frame, running_s: heard.append((frame, running_s)))
    rank_in, api = sockets.ctx.socket(zmq.PULL), sockets.ctx.socket(zmq.PUSH)
    rank_in.connect(addresses.batch)  # a rank 0 that takes the step and never answers
    api.connect(addresses.request)
    try:
        router.submit(request("Stuck:", sampling={"max_new_tokens": 4}))
        question = encode(ControlRequest(cid="c1", kind="stats"))
        threading.Timer(0.3, api.send, [question]).start()
        with pytest.raises(GroupLost):
            router.step(sockets.execute)
        assert [frame for frame, _ in heard] == [question] and 0.2 < heard[0][1] < 1.0
    finally:
        rank_in.close(linger=0)
        api.close(linger=0)
        sockets.ctx.destroy(linger=0)
    stats = router.answer_mid_step(ControlRequest(cid="c2", kind="stats"), 5.0, behind=False)
    assert stats is not None and stats.error is None and "waiting_requests" in stats.payload
    assert router.answer_mid_step(ControlRequest(cid="c3", kind="health"), 5.0, behind=True).error is None
    overdue = router.answer_mid_step(ControlRequest(cid="c4", kind="health"), STEP_OVERDUE_S + 1, behind=False)
    assert "no result for 21 s" in overdue.error and "--step-timeout" in overdue.error
    # what changes state waits for the step's end, and so does a read behind it
    assert router.answer_mid_step(request("Later"), 5.0, behind=False) is None
    assert router.answer_mid_step(ControlRequest(cid="c5", kind="flush_cache"), 5.0, behind=False) is None
    assert router.answer_mid_step(ControlRequest(cid="c6", kind="stats"), 5.0, behind=True) is None


def test_a_full_queue_answers_429(config):
    router = Router(dataclasses.replace(config, max_queued_requests=2))
    assert router.submit(request("one")) == [] and router.submit(request("two")) == []
    (out,) = router.submit(request("three"))
    assert out.status == 429 and "queued" in out.error


def test_a_grammar_compiles_while_other_requests_are_served(router, runner):
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    constrained = request("A JSON object:", sampling={"max_new_tokens": 12, "json_schema": schema})
    plain = request("Hello there", sampling={"max_new_tokens": 2, "ignore_eos": True})
    assert router.submit(constrained) == [] and constrained.rid in router.compiling
    assert not router.idle() and router.queued() == 1
    assert router.submit(plain) == []
    outputs = drive(router, runner, {plain.rid: [], constrained.rid: []})
    assert outputs[plain.rid][-1].completion_tokens == 2
    assert json.loads("".join(out.text for out in outputs[constrained.rid]))["n"] is not None
    again = request("Another:", sampling={"max_new_tokens": 12, "json_schema": schema})
    assert router.submit(again) == [] and again.rid not in router.compiling  # cached now


def test_a_grammar_that_does_not_compile_and_an_abort_while_compiling(router, runner):
    bad = request("x", sampling={"regex": "(unclosed"})
    left = request("y", sampling={"regex": "[a-z]{3}"})
    router.submit(bad)
    router.submit(left)
    (aborted,) = router.submit(AbortRequest(rid=left.rid))
    assert aborted.finish_reason["type"] == "abort" and aborted.error is None and left.rid not in router.compiling
    (out,) = drive(router, runner, {bad.rid: []})[bad.rid]
    assert out.status == 400 and "invalid regex" in out.error
    assert_serves(router, runner)


def test_a_text_longer_than_any_prompt_is_refused_unread(router, runner):
    """Tokenizing runs on the router's loop: a text that cannot fit the context whatever its
    tokens is refused on its length alone, and so is such a text sent to /tokenize."""
    limit = router.intake.max_text_chars
    (out,) = router.submit(request("x" * (limit + 1)))
    assert out.status == 400 and f"no text of more than {limit} characters" in out.error

    def control(kind, **args):
        return router.submit(ControlRequest(cid="t", kind=kind, args=args))[0]

    assert "characters" in control("tokenize", prompts=["x" * (limit // 2 + 1)] * 2).error
    assert "token ids to detokenize" in control("detokenize", tokens=[[5] * (limit // 2 + 1)] * 2).error
    assert_serves(router, runner)


def test_the_samples_of_one_prompt_are_tokenized_once(router, monkeypatch):
    calls = []
    encode = type(router.tokenizer).encode

    def counted(tokenizer, text, **kw):
        calls.append(text)
        return encode(tokenizer, text, **kw)

    monkeypatch.setattr(type(router.tokenizer), "encode", counted)
    prompt = "Tell me a story about a lighthouse keeper."
    msgs = [request(prompt, sampling={"max_new_tokens": 2, "temperature": 1.0, "seed": i}) for i in range(4)]
    for msg in msgs:
        assert router.submit(msg) == []
    assert calls == [prompt]
    assert len({tuple(r.prompt_ids) for r in router.scheduler.waiting}) == 1


def test_a_stop_regex_that_backtracks_for_ever_ends_its_request_alone(router, runner):
    """A grammar makes the model write a run of x, on which ``(x|xx)+y`` backtracks
    exponentially: the search times out, that request ends with a 400, the other one finishes."""
    bomb = request("x", sampling={"max_new_tokens": 100, "regex": "x{100}", "stop_regex": [r"(x|xx)+y"]})
    plain = request("Hello there", sampling={"max_new_tokens": 6, "ignore_eos": True})
    router.submit(bomb)
    router.submit(plain)
    outputs = drive(router, runner, {bomb.rid: [], plain.rid: []})
    (last,) = outputs[bomb.rid]
    assert last.status == 400 and "simplify it" in last.error
    assert outputs[plain.rid][-1].completion_tokens == 6
    assert_serves(router, runner)


def test_a_profile_is_owed_to_the_ranks_counts_the_router_steps_and_ends_with_the_group(router, runner):
    profile = {"output_dir": "/traces", "profile_id": "r", "prefix": "", "activities": ["CPU"], "num_steps": 3}
    profile |= {"with_stack": False, "record_shapes": False}
    (started,) = router.submit(ControlRequest(cid="p", kind="start_profile", args=profile))
    assert started.payload == {"trace_files": ["/traces/r-TP-0.trace.json.gz"]}
    assert [m.start for m in router.profiles.take()] == [True]
    run(router, runner, request("Count to ten:", sampling={"max_new_tokens": 5, "temperature": 0.0}))
    assert [m.start for m in router.profiles.take()] == [False]  # after the third of its steps
    (again,) = router.submit(ControlRequest(cid="p", kind="start_profile", args={**profile, "num_steps": None}))
    assert again.error is None
    router.lose_group(0, "rank 0 died")
    (refused,) = router.submit(ControlRequest(cid="p", kind="start_profile", args=profile))
    assert "restarting (rank 0 died)" in refused.error
    (stopped,) = router.submit(ControlRequest(cid="s", kind="stop_profile"))
    assert stopped.error == "no profile is running: POST /start_profile first"
