"""Scheduler end to end against the stand-in executor: every output must equal the
reference generation, so any wrong page index shows up as a wrong token."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixcluster.block_hash import tenant_namespace, tenant_salt
from radixcluster.protocol import SamplingParams, StepResult
from radixcluster.router.cache.radix_tree import IntegrityError
from radixcluster.router.request import Request
from radixcluster.router.scheduler import Scheduler, SchedulerConfig
from radixcluster.router.tenant_quota import TenantQuota
from support.stand_in_executor import StandInExecutor, next_token, reference_generate

EOS = 7


def make(
    num_pages: int = 256, page_size: int = 1, max_running: int = 8, chunk: int = 512, ctx: int = 8192, **kw
) -> tuple[Scheduler, StandInExecutor]:
    cfg = SchedulerConfig(num_pages, page_size, max_running, chunk, ctx, **kw)
    return Scheduler(cfg), StandInExecutor(num_pages, page_size, max_running, ctx // page_size + 1)


def req(rid: str, prompt, max_new: int = 8, salt: str | None = None, **sp) -> Request:
    sp.setdefault("ignore_eos", True)
    return Request(
        rid, np.asarray(prompt, dtype=np.int32), SamplingParams(max_new_tokens=max_new, **sp), (EOS,), cache_salt=salt
    )


def step(s: Scheduler, ex: StandInExecutor):
    batch = s.schedule()
    if batch is not None:
        s.process_result(batch, ex(batch.forward))
        s.check_integrity()
    return batch


def run(s: Scheduler, ex: StandInExecutor, max_steps: int = 100_000) -> int:
    steps = 0
    while not s.is_idle():
        assert step(s, ex) is not None, "stuck: work left but nothing scheduled"
        steps += 1
        assert steps < max_steps
    assert s.schedule() is None
    return steps


def check_outputs(reqs: list[Request], ctx: int = 8192) -> None:
    for r in reqs:
        eos = () if r.sampling.ignore_eos else (EOS,)
        assert r.output_ids == reference_generate(r.prompt_ids, r.sampling.max_new_tokens, eos, ctx), r.rid
        assert r.cached_tokens <= r.prompt_len - 1 or r.cached_tokens == 0


def rand(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n).astype(np.int32)


def warm(s: Scheduler, ex: StandInExecutor, prompt, salt: str | None = None) -> Request:
    r = req(f"warm{len(s.reqs)}-{s.counters.total_requests}", prompt, max_new=0, salt=salt)
    s.add_request(r)
    run(s, ex)
    return r


# ---------------------------------------------------------------- policies


def test_lpm_runs_the_longest_cached_prefix_first() -> None:
    s, ex = make()
    shared = rand(100, 1)
    warm(s, ex, np.concatenate([shared, [1]]))
    cold = req("cold", rand(50, 2))
    hot = req("hot", np.concatenate([shared, rand(10, 3)]))
    s.add_request(cold)
    s.add_request(hot)
    batch = s.schedule()
    assert [r.rid for r in batch.requests] == ["hot", "cold"]
    assert batch.forward.prefix_lens.tolist() == [100, 0]
    s.process_result(batch, ex(batch.forward))
    run(s, ex)
    check_outputs([cold, hot])
    assert hot.cached_tokens == 100 and cold.cached_tokens == 0


def test_dfs_weight_groups_requests_of_the_heaviest_subtree() -> None:
    s, ex = make(schedule_policy="dfs-weight")
    a, b = rand(40, 1), rand(40, 2)
    warm(s, ex, np.concatenate([a, [1]]))
    warm(s, ex, np.concatenate([b, [1]]))
    reqs = [
        req("a0", np.concatenate([a, [5]])),
        req("b0", np.concatenate([b, [5]])),
        req("b1", np.concatenate([b, [6]])),
    ]
    for r in reqs:
        s.add_request(r)
    assert [r.rid for r in s.policy.order(s.waiting)] == ["b0", "b1", "a0"]
    run(s, ex)
    check_outputs(reqs)


def test_in_batch_dedup_runs_one_first_so_the_rest_hit() -> None:
    s, ex = make()
    shared = rand(200, 4)
    reqs = [req(f"r{i}", np.concatenate([shared, rand(5, 10 + i)])) for i in range(3)]
    for r in reqs:
        s.add_request(r)
    first = s.schedule()
    assert [r.rid for r in first.requests] == ["r0"]
    s.process_result(first, ex(first.forward))
    run(s, ex)
    check_outputs(reqs)
    assert [r.cached_tokens for r in reqs] == [0, 200, 200]


def test_fcfs_is_forced_when_the_cache_is_off() -> None:
    s, ex = make(num_pages=400, enable_radix_cache=False, schedule_policy="lpm")
    assert s.policy.policy == "fcfs"
    shared = rand(60, 5)
    reqs = [req(f"r{i}", np.concatenate([shared, [i]])) for i in range(4)]
    for r in reqs:
        s.add_request(r)
    assert [r.rid for r in s.schedule().requests] == ["r0", "r1", "r2", "r3"]
    s, ex = make(enable_radix_cache=False)
    for r in (reqs := [req(f"r{i}", np.concatenate([shared, [i]])) for i in range(4)]):
        s.add_request(r)
    run(s, ex)
    check_outputs(reqs)
    assert s.tree.node_count == 0 and s.allocator.num_free == 256
    assert s.stats()["cached_tokens_total"] == 0


# ---------------------------------------------------------------- chunking, memory pressure


@pytest.mark.parametrize("page_size", [1, 16])
def test_long_prompt_chunked_equals_unchunked(page_size: int) -> None:
    prompt = rand(5000, 6)
    outs = []
    for chunk in (512, 8192):
        s, ex = make(num_pages=6000 // page_size, page_size=page_size, chunk=chunk)
        r = req("long", prompt, max_new=5)
        s.add_request(r)
        steps = run(s, ex)
        outs.append(r.output_ids)
        if chunk == 512:
            assert steps >= 10 + 4
        assert ex.tokens_computed == 5000 + 4
    assert outs[0] == outs[1] == reference_generate(prompt, 5)


@pytest.mark.parametrize("page_size", [1, 4])
def test_tiny_pool_retracts_and_still_completes_everything(page_size: int) -> None:
    prompts = [np.concatenate([rand(30, 7), rand(10 + i, 20 + i)]) for i in range(12)]
    results = {}
    for pages in (80 // page_size + 4, 4096):
        s, ex = make(num_pages=pages, page_size=page_size, max_running=8, chunk=64)
        reqs = [req(f"r{i}", p, max_new=20) for i, p in enumerate(prompts)]
        for r in reqs:
            s.add_request(r)
        run(s, ex)
        check_outputs(reqs)
        results[pages] = [r.output_ids for r in reqs]
        stats = s.stats()
        assert stats["cached_tokens_total"] <= stats["prompt_tokens_total"]
        assert all(r.cached_tokens < r.prompt_len for r in reqs)
        if pages < 100:
            assert stats["retractions_total"] > 0
    assert results[80 // page_size + 4] == results[4096]


def test_schedule_conservativeness_holds_back_more_and_retracts_less() -> None:
    """SGLang's --schedule-conservativeness scales the share of running requests' remaining tokens
    that admission holds back (at most all of them): a cautious scheduler admits fewer at once and
    retracts fewer, with the same outputs."""
    prompts = [np.concatenate([rand(30, 7), rand(10 + i, 20 + i)]) for i in range(12)]
    retracted, outputs = {}, {}
    for conservativeness in (0.5, 1.0, 3.0):
        s, ex = make(num_pages=84, max_running=8, chunk=64, schedule_conservativeness=conservativeness)
        assert s.reserve_ratio == pytest.approx(min(1.0, 0.7 * conservativeness))
        assert s.min_reserve_ratio == pytest.approx(min(1.0, 0.1 * conservativeness))
        reqs = [req(f"r{i}", p, max_new=20) for i, p in enumerate(prompts)]
        for r in reqs:
            s.add_request(r)
        run(s, ex)
        check_outputs(reqs)
        retracted[conservativeness] = s.counters.retractions_total
        outputs[conservativeness] = [r.output_ids for r in reqs]
    assert retracted[0.5] > retracted[1.0] > retracted[3.0]
    assert outputs[0.5] == outputs[1.0] == outputs[3.0]
    with pytest.raises(ValueError, match="schedule_conservativeness"):
        make(schedule_conservativeness=0)


def test_cached_tokens_are_counted_once_even_after_retraction() -> None:
    s, ex = make(num_pages=70, max_running=4, chunk=64)
    shared = rand(30, 8)
    reqs = [req(f"r{i}", np.concatenate([shared, [i]]), max_new=25) for i in range(4)]
    for r in reqs:
        s.add_request(r)
    run(s, ex)
    check_outputs(reqs)
    assert s.counters.retractions_total > 0
    assert any(r.retractions for r in reqs)
    assert all(r.cached_tokens <= r.prompt_len - 1 for r in reqs)
    stats = s.stats()
    assert stats["total_requests"] == 4 and stats["prompt_tokens_total"] == 4 * 31
    assert stats["cached_tokens_total"] == sum(r.cached_tokens for r in reqs) <= 3 * 30


# ---------------------------------------------------------------- lifecycle


def test_abort_and_flush_return_the_pool_to_full() -> None:
    s, ex = make(num_pages=400)
    reqs = [req(f"r{i}", rand(50, 30 + i), max_new=50) for i in range(5)]
    for r in reqs:
        s.add_request(r)
    for _ in range(4):
        step(s, ex)
    assert not s.flush_cache()
    assert s.abort_request("r1") and not s.abort_request("r1") and not s.abort_request("nope")
    assert reqs[1].finish_reason == {"type": "abort", "message": "aborted"}
    batch = s.schedule()  # a step in flight when a request is aborted
    s.abort_request(batch.requests[0].rid)
    touched = s.process_result(batch, ex(batch.forward))
    assert batch.requests[0] not in touched
    for r in reqs:
        s.abort_request(r.rid)
    assert s.is_idle() and s.schedule() is None
    assert s.allocator.num_free + s.tree.cached_tokens == 400 and s.tree.protected_tokens == 0
    assert s.flush_cache()
    assert s.allocator.num_free == 400 and s.tree.node_count == 0


def test_max_new_tokens_zero_warms_the_cache() -> None:
    s, ex = make()
    prompt = rand(80, 9)
    w = warm(s, ex, prompt)
    assert w.output_ids == [] and w.finish_reason == {"type": "length", "length": 0}
    assert s.tree.cached_tokens == 80
    r = req("after", np.concatenate([prompt, [3, 4]]))
    s.add_request(r)
    run(s, ex)
    check_outputs([r])
    assert r.cached_tokens == 80


def test_full_prompt_hit_still_computes_the_last_token() -> None:
    s, ex = make()
    prompt = rand(40, 10)
    warm(s, ex, prompt)
    r = req("same", prompt)
    s.add_request(r)
    batch = s.schedule()
    assert batch.forward.prefix_lens.tolist() == [39] and batch.forward.extend_lens.tolist() == [1]
    s.process_result(batch, ex(batch.forward))
    run(s, ex)
    check_outputs([r])
    assert r.cached_tokens == 39


def test_zero_length_match_after_page_truncation() -> None:
    s, ex = make(page_size=4)
    warm(s, ex, [1, 2, 3, 4])
    r = req("short", [1, 2, 3, 4])  # may reuse 3 tokens: no whole page
    s.add_request(r)
    run(s, ex)
    check_outputs([r])
    assert r.cached_tokens == 0


def test_duplicate_pages_are_freed_and_the_running_table_repointed() -> None:
    # fcfs does no in-batch dedup: both compute the same prompt in one step
    s, ex = make(num_pages=120, page_size=2, schedule_policy="fcfs")
    prompt = rand(40, 11)
    a, b = req("a", prompt, max_new=1), req("b", prompt, max_new=30)
    s.add_request(a)
    s.add_request(b)
    first = s.schedule()
    assert [r.rid for r in first.requests] == ["a", "b"]
    s.process_result(first, ex(first.forward))
    assert a.finished and b.synced_pages == 0  # b now points at a's pages: resend its table
    others = [req(f"o{i}", rand(30, 40 + i), max_new=10) for i in range(2)]  # reuse the freed pages
    for r in others:
        s.add_request(r)
    run(s, ex)
    check_outputs([a, b, *others])


def test_stop_token_eos_context_length_and_finish_request() -> None:
    prompt = rand(20, 12)
    ref = reference_generate(prompt, 50)
    s, ex = make(ctx=30)
    stop = req("stop", prompt, max_new=50, stop_token_ids=[ref[3]])
    ctx = req("ctx", rand(20, 13), max_new=50)
    eos_prompt = next(rand(20, seed) for seed in range(100, 10_000) if EOS in reference_generate(rand(20, seed), 10))
    eos = req("eos", eos_prompt, max_new=10, ignore_eos=False)
    manual = req("manual", rand(20, 14), max_new=50)
    for r in (stop, ctx, eos, manual):
        s.add_request(r)
    step(s, ex)
    step(s, ex)
    assert s.finish_request("manual", {"type": "stop", "matched": "</s>"})
    run(s, ex)
    assert stop.finish_reason == {"type": "stop", "matched": ref[3]} and stop.output_ids == ref[:4]
    assert ctx.finish_reason == {"type": "length", "length": 10} and len(ctx.output_ids) == 10
    assert eos.finish_reason["type"] == "stop" and eos.output_ids[-1] == EOS
    assert manual.finish_reason == {"type": "stop", "matched": "</s>"} and len(manual.output_ids) == 2
    with pytest.raises(ValueError, match="context"):
        s.add_request(req("too-long", rand(30, 15)))


# ---------------------------------------------------------------- the batch on the wire


def test_decode_steps_send_only_new_pages_and_sampling_rows() -> None:
    s, ex = make(page_size=4)
    plain = req("plain", rand(10, 16), max_new=6)
    pen = Request(
        "pen",
        rand(10, 17),
        SamplingParams(
            max_new_tokens=6,
            temperature=0.5,
            top_k=5,
            seed=3,
            frequency_penalty=0.5,
            ignore_eos=True,
            logit_bias={7: -100.0, 3: 2.5},
        ),
    )
    s.add_request(plain)
    s.add_request(pen)
    prefill = s.schedule()
    fwd = prefill.forward
    assert fwd.table_counts.tolist() == [3, 3] and fwd.vocab_mask is None and fwd.logprob_starts is None
    s.process_result(prefill, ex(fwd))
    decode = s.schedule().forward  # position 10 still fits in page 2
    assert decode.table_slots.size == 0 and decode.extend_lens.tolist() == [1, 1]
    assert decode.input_ids.tolist() == [plain.output_ids[-1], pen.output_ids[-1]]
    sb = decode.sampling
    assert sb.seed.tolist() == [-1, 3] and sb.top_k.tolist() == [-1, 5] and sb.temperature.tolist() == [1.0, 0.5]
    assert sb.penalty_lens.tolist() == [0, 1] and sb.penalty_ids.tolist() == pen.output_ids
    assert sb.bias_lens.tolist() == [0, 2] and sb.bias_ids.tolist() == [7, 3]
    assert sb.bias_values.tolist() == [-100.0, 2.5]


def test_eos_and_stop_token_ids_cannot_be_sampled_before_min_new_tokens() -> None:
    """As vLLM's and SGLang's min_tokens: -inf on them until the request has that many tokens
    (EOS not, with ignore_eos); a grammar's requests end as their grammar says."""
    s, ex = make(page_size=4)
    early = Request(
        "early",
        rand(10, 18),
        SamplingParams(max_new_tokens=6, min_new_tokens=2, stop_token_ids=[9], logit_bias={7: 1.5}),
        eos_token_ids=(2,),
    )
    lenient = Request("lenient", rand(10, 19), SamplingParams(min_new_tokens=2, ignore_eos=True), eos_token_ids=(2,))
    for r in (early, lenient):
        s.add_request(r)
    banned = s.schedule()
    sb = banned.forward.sampling
    assert sb.bias_lens.tolist() == [3, 0] and sb.bias_ids.tolist() == [7, 2, 9]
    assert sb.bias_values.tolist() == [1.5, float("-inf"), float("-inf")]
    assert lenient.step_bias()[0].size == 0  # ignore_eos and no stop_token_ids: nothing to ban
    s.process_result(banned, ex(banned.forward))
    s.process_result(second := s.schedule(), ex(second.forward))
    assert len(early.output_ids) == 2 and s.schedule().forward.sampling.bias_ids.tolist() == [7]


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prefill_step_carries_the_next_token_of_every_running_request(page_size: int) -> None:
    s, ex = make(page_size=page_size, chunk=16)
    early = [req(f"early{i}", rand(6 + i, 70 + i), max_new=12) for i in range(2)]
    for r in early:
        s.add_request(r)
    step(s, ex)
    assert step(s, ex).forward.extend_lens.tolist() == [1, 1]  # nothing waits: a decode step
    late = Request(
        "late",
        rand(40, 80),
        SamplingParams(max_new_tokens=5, ignore_eos=True),
        return_logprob=True,
        logprob_start_len=0,
    )
    s.add_request(late)
    scored = 0
    for chunk in (16, 16, 8):  # the late prompt in three chunks, the early requests decoding in each
        before = [len(r.output_ids) for r in early]
        batch = s.schedule()
        fwd = batch.forward
        assert fwd.extend_lens.tolist() == [chunk, 1, 1] and fwd.logprob_starts.tolist() == [0, -1, -1]
        end = scored + chunk
        assert fwd.logprob_next_ids.tolist() == [late.prompt_ids[end] if end < 40 else -1, -1, -1]
        assert fwd.input_ids[chunk:].tolist() == [r.output_ids[-1] for r in early]
        assert fwd.positions[chunk:].tolist() == [r.prompt_len + n - 1 for r, n in zip(early, before)]
        result = ex(fwd)
        # the late request's only: every new token's, its last one's where the prompt goes on
        result.input_logprobs = np.arange(scored, scored + chunk - (end == 40), dtype=np.float32)
        scored += chunk
        s.process_result(batch, result)
        s.check_integrity()
        assert [len(r.output_ids) for r in early] == [n + 1 for n in before]
    assert len(late.output_ids) == 1
    assert late.input_logprobs == list(range(39))
    run(s, ex)
    check_outputs([*early, late])


def test_prompt_logprobs_limit_the_match_and_are_collected() -> None:
    s, ex = make()
    prompt = rand(30, 18)
    warm(s, ex, prompt)
    r = Request(
        "lp",
        prompt,
        SamplingParams(max_new_tokens=2, ignore_eos=True),
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=10,
    )
    s.add_request(r)
    batch = s.schedule()
    fwd = batch.forward
    assert fwd.prefix_lens.tolist() == [10] and fwd.logprob_starts.tolist() == [0]
    result = ex(fwd)
    result.input_logprobs = np.arange(19, dtype=np.float32)  # the worker scores 20 new tokens but the last
    result.input_top_logprob_ids = np.tile(np.array([[7, 8, 9]], dtype=np.int32), (19, 1))  # K: the batch's largest
    result.input_top_logprob_values = np.tile(np.array([[-0.3, -0.4, -0.5]], dtype=np.float32), (19, 1))
    result.logprobs = np.array([-0.5], dtype=np.float32)
    result.top_logprob_ids = np.array([[4, 5]], dtype=np.int32)
    result.top_logprob_values = np.array([[-0.1, -0.2]], dtype=np.float32)
    s.process_result(batch, result)
    assert r.input_logprobs == list(range(19)) and r.cached_tokens == 10  # the last scores an output
    assert r.input_top_logprobs == [[[pytest.approx(-0.3), 7], [pytest.approx(-0.4), 8]]] * 19  # its own 2
    assert r.output_logprobs[0][:2] == [-0.5, r.output_ids[0]]
    assert r.output_logprobs[0][2] == [[pytest.approx(-0.1), 4], [pytest.approx(-0.2), 5]]


def test_prompt_logprobs_of_a_batch_stay_with_their_requests() -> None:
    """The worker returns extend - 1 - start values per request; a second request's values
    must not shift (a regression: they were read as extend - start per request)."""
    s, ex = make()
    a = Request("a", rand(8, 31), SamplingParams(max_new_tokens=0), return_logprob=True, logprob_start_len=2)
    b = Request("b", rand(12, 32), SamplingParams(max_new_tokens=0), return_logprob=True, logprob_start_len=3)
    s.add_request(a)
    s.add_request(b)
    batch = s.schedule()
    fwd = batch.forward
    assert fwd.logprob_starts.tolist() == [2, 3]
    result = ex(fwd)
    result.input_logprobs = np.array([10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 25, 26, 27], dtype=np.float32)
    s.process_result(batch, result)
    assert a.input_logprobs == [10, 11, 12, 13, 14]  # tokens 3..7
    assert b.input_logprobs == [20, 21, 22, 23, 24, 25, 26, 27]  # tokens 4..11


def test_prompt_logprobs_across_chunks_score_every_token() -> None:
    """A chunk's last position scores the next chunk's first token (the worker is told it), so
    no prompt token goes unscored at a chunk boundary (they were None before)."""
    s, ex = make(chunk=8)
    prompt = rand(12, 33)
    r = Request("c", prompt, SamplingParams(max_new_tokens=0), return_logprob=True, logprob_start_len=0)
    s.add_request(r)
    for expected, next_id in ((8, prompt[8]), (3, -1)):
        batch = s.schedule()
        assert batch.forward.logprob_next_ids.tolist() == [next_id]
        result = ex(batch.forward)
        result.input_logprobs = np.arange(len(r.input_logprobs), len(r.input_logprobs) + expected, dtype=np.float32)
        s.process_result(batch, result)
    # tokens 1..11: 8 scored in chunk one (token 8 at its last position), 3 in chunk two
    assert r.input_logprobs == list(range(11))


def test_a_stale_result_is_refused() -> None:
    s, _ = make()
    s.add_request(req("x", rand(10, 19)))
    batch = s.schedule()
    with pytest.raises(ValueError, match="step"):
        s.process_result(batch, StepResult(step_id=batch.forward.step_id + 1, next_token_ids=np.zeros(1, np.int32)))


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_lost_pool_requeues_every_request_and_a_new_one_finishes_them_unchanged(page_size: int) -> None:
    """What a replaced TP group means to the scheduler: mid-run (a chunked prefill, decodes, a
    queue), the KV is gone; every admitted request goes back to the queue front in admission
    order, the tree empties, and against a fresh executor (an empty pool) each one recomputes
    what it had and ends with exactly the reference tokens."""
    s, ex = make(num_pages=256 // page_size * 2, page_size=page_size, max_running=3, chunk=32)
    shared = rand(40, 5)
    reqs = [req(f"r{i}", np.concatenate([shared, rand(5 + 7 * i, 50 + i)]), max_new=12) for i in range(5)]
    for r in reqs:
        s.add_request(r)
    for _ in range(6):
        step(s, ex)
    admitted = sorted(s.running + s.prefilling, key=lambda r: r.admit_seq)
    generated = {r.rid: list(r.output_ids) for r in reqs}
    assert admitted and any(generated.values())
    assert s.requeue_all() == admitted
    assert s.waiting[: len(admitted)] == admitted and not s.running and not s.prefilling
    assert s.tree.cached_tokens == 0 and s.allocator.num_free == s.config.num_pages
    s.check_integrity()
    for r in reqs:
        assert r.output_ids == generated[r.rid]  # nothing streamed is taken back
    _, fresh = make(num_pages=256 // page_size * 2, page_size=page_size, max_running=3, chunk=32)
    run(s, fresh)
    check_outputs(reqs)


# ---------------------------------------------------------------- random workloads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    page_size=st.sampled_from([1, 2, 16]),
    pool_factor=st.sampled_from([1, 2, 8]),
    policy=st.sampled_from(["lpm", "dfs-weight", "fcfs"]),
    cache=st.booleans(),
    chunk=st.sampled_from([16, 64, 1024]),
    specs=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(0, 12), st.sampled_from([None, "t"])),
        min_size=1,
        max_size=10,
    ),
    aborts=st.lists(st.integers(0, 9), max_size=2),
)
def test_random_workloads_match_the_reference(page_size, pool_factor, policy, cache, chunk, specs, aborts) -> None:
    trunks = [rand(48, 50 + i) for i in range(3)]
    prompts = [np.concatenate([trunks[t][: 16 * (t + 1)], rand(n, 60 + i)]) for i, (t, n, _, _) in enumerate(specs)]
    need = max(-(-(len(p) + m) // page_size) for p, (_, _, m, _) in zip(prompts, specs))
    s, ex = make(
        num_pages=need * pool_factor + 1,
        page_size=page_size,
        max_running=4,
        chunk=max(chunk, page_size),
        ctx=256,
        schedule_policy=policy,
        enable_radix_cache=cache,
    )
    reqs = [req(f"r{i}", p, max_new=m, salt=salt) for i, (p, (_, _, m, salt)) in enumerate(zip(prompts, specs))]
    for r in reqs:
        s.add_request(r)
    for i, victim in enumerate(aborts):
        for _ in range(3 * (i + 1)):
            step(s, ex)
        s.abort_request(f"r{victim}")
    run(s, ex)
    check_outputs([r for r in reqs if r.finish_reason["type"] != "abort"], ctx=256)
    assert s.tree.protected_tokens == 0
    assert s.allocator.num_free + s.tree.cached_tokens // page_size == s.config.num_pages
    assert s.flush_cache() and s.allocator.num_free == s.config.num_pages


def test_next_token_reads_the_whole_context() -> None:
    a = rand(10, 20)
    b = a.copy()
    b[0] += 1
    assert next_token(a) != next_token(b) or next_token(a[1:]) != next_token(b[1:])


def test_without_the_radix_cache_every_policy_is_fcfs() -> None:
    for policy in ("lpm", "dfs-weight"):
        assert make(schedule_policy=policy, enable_radix_cache=False)[0].policy.policy == "fcfs"
    assert make(schedule_policy="dfs-weight")[0].policy.policy == "dfs-weight"


@pytest.mark.parametrize("page_size", [1, 16])
def test_decodes_sharing_a_cached_prompt_are_grouped(page_size: int) -> None:
    s, ex = make(page_size=page_size)
    system = rand(64, 30)
    warm(s, ex, np.concatenate([system, [1]]))
    reqs = [req(f"r{i}", np.concatenate([system, rand(5, 40 + i)]), max_new=4) for i in range(3)]
    loner = req("loner", rand(20, 50), max_new=4)
    for r in (*reqs, loner):
        s.add_request(r)
    while (batch := step(s, ex)).forward.extend_lens.max() > 1:
        pass
    fwd = batch.forward
    at = {r.rid: i for i, r in enumerate(batch.requests)}
    groups = [fwd.prefix_groups[at[r.rid]] for r in reqs]
    assert groups[0] >= 0 and groups == [groups[0]] * 3 and fwd.prefix_groups[at["loner"]] == -1
    assert fwd.prefix_group_lens[groups[0]] == 64
    run(s, ex)
    check_outputs([*reqs, loner])


# ---------------------------------------------------------------- tenant quotas


def tenant_req(rid: str, prompt, tenant: str, max_new: int = 8) -> Request:
    r = req(rid, prompt, max_new, salt=tenant_salt(tenant, None))
    r.tenant = tenant
    return r


def test_a_tenant_at_its_running_quota_waits_while_other_tenants_run() -> None:
    s, ex = make(tenant_quotas={"a": TenantQuota(max_running_requests=1)})
    reqs = [tenant_req(f"a{i}", rand(20, i), "a") for i in range(3)]
    reqs += [tenant_req(f"b{i}", rand(20, 10 + i), "b") for i in range(2)]
    for r in reqs:
        s.add_request(r)
    first = s.schedule()
    assert [r.rid for r in first.requests] == ["a0", "b0", "b1"]
    s.process_result(first, ex(first.forward))
    most = 0
    while not s.is_idle():
        step(s, ex)
        most = max(most, sum(r.tenant == "a" for r in s.running + s.prefilling))
    assert most == 1
    check_outputs(reqs)


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_tenant_over_its_cache_quota_evicts_its_own_oldest_runs(page_size: int) -> None:
    s, ex = make(num_pages=1024, page_size=page_size, tenant_quotas={"a": TenantQuota(max_cached_tokens=100)})
    run_len = 65 // page_size * page_size
    a, b = tenant_namespace("a"), tenant_namespace("b")
    for i in range(3):
        s.add_request(tenant_req(f"b{i}", rand(65, 20 + i), "b", max_new=0))
    run(s, ex)
    prompts = [rand(65, i) for i in range(4)]
    for i, prompt in enumerate(prompts):
        s.add_request(tenant_req(f"a{i}", prompt, "a", max_new=0))
        run(s, ex)
        assert s.tree.namespace_tokens(a) <= 100
    assert s.tree.namespace_tokens(b) == 3 * run_len  # the other tenant's runs stay
    assert s.tree.match_prefix(prompts[-1], a).length == run_len  # the newest run stays
    assert s.tree.match_prefix(prompts[0], a).length == 0
    assert s.stats()["tenants"]["a"]["cached_tokens"] == s.tree.namespace_tokens(a)
    # a running request's pages count but stay until it ends; then the quota binds again
    big = tenant_req("big", rand(150, 9), "a", max_new=4)
    s.add_request(big)
    step(s, ex)
    assert s.tree.namespace_tokens(a) >= 144
    run(s, ex)
    assert s.tree.namespace_tokens(a) <= 100
    check_outputs([big])


def test_a_request_pins_its_prompt_once_computed_and_a_refused_pin_costs_it_nothing(caplog) -> None:
    s, ex = make(num_pages=64, page_size=4, max_pinned_fraction=0.5)
    shared = rand(40, 1)
    pinned = req("pinned", np.concatenate([shared, rand(3, 2)]))
    pinned.pins = [(shared, 60.0), (pinned.prompt_ids, 60.0)]
    s.add_request(pinned)
    run(s, ex)
    assert pinned.pinned_tokens == 40  # the whole prompt's 43 tokens end inside a page: 40 are cached
    assert s.cache.pins.pinned_tokens() == 40
    greedy = req("greedy", rand(120, 3))
    greedy.pins = [(greedy.prompt_ids, 60.0)]  # over the 128 tokens pins may hold with the first
    s.add_request(greedy)
    run(s, ex)
    assert greedy.pinned_tokens == 0 and "refused" in caplog.text
    check_outputs([pinned, greedy])
    s.add_request(req("flood", rand(200, 4)))  # needs every page but the pinned ones
    run(s, ex)
    assert s.tree.match_prefix(shared).length == 40


@pytest.mark.parametrize("chunk", [16, 512])
@pytest.mark.parametrize("prompt_len, max_new", [(330, 10), (300, 40)], ids=["prompt", "output"])
def test_pins_give_way_to_a_request_that_cannot_run_beside_them(
    caplog, chunk: int, prompt_len: int, max_new: int
) -> None:
    """It fits the pool but not what the pins leave, in its prompt or once it decodes: the pin
    due first is released, and it runs (before, the queue waited for ever behind it, or the
    scheduler raised)."""
    s, ex = make(num_pages=100, page_size=4, chunk=chunk, max_pinned_fraction=0.5)
    early, late = rand(40, 1), rand(40, 2)
    for prompt, ttl in ((early, 30.0), (late, 60.0)):
        pinned = req(f"pin{ttl}", prompt, max_new=1)
        pinned.pins = [(prompt, ttl)]
        s.add_request(pinned)
        run(s, ex)
    assert s.cache.pins.pinned_tokens() == 80
    big, small = req("big", rand(prompt_len, 3), max_new=max_new), req("small", rand(10, 4), max_new=4)
    s.add_request(big)
    s.add_request(small)
    run(s, ex)
    check_outputs([big, small])
    assert "a pin of 40 tokens was released: a request could not run beside it" in caplog.text
    assert s.tree.match_prefix(late).length == 40 and len(s.cache.pins) == 1  # the later pin was enough


def test_the_pool_check_names_a_lost_page_and_a_page_with_two_owners() -> None:
    s, ex = make(num_pages=64)
    first, second = req("a", rand(12, 1), max_new=6), req("b", rand(12, 2), max_new=6)
    s.add_request(first)
    s.add_request(second)
    step(s, ex)
    step(s, ex)  # a decode step: each holds a private page for its new token
    leaked = s.cache.allocator.alloc(1)
    with pytest.raises(IntegrityError, match="1 pages without an owner, 0 with several"):
        s.check_integrity()
    s.cache.allocator.free(leaked)
    assert s.cache.private_pages(first) and s.cache.private_pages(second)
    second.pages.append(first.pages[-1])
    with pytest.raises(IntegrityError, match="0 pages without an owner, 1 with several"):
        s.check_integrity()


def test_an_idle_turn_checks_the_pool_counts() -> None:
    s, ex = make(num_pages=64)
    s.add_request(req("a", rand(12, 1), max_new=4))
    while not s.is_idle():
        batch = s.schedule()
        s.process_result(batch, ex(batch.forward))
    s.cache.allocator.alloc(1)  # a lost page
    with pytest.raises(IntegrityError, match="free \\+ cached != pool when idle"):
        s.schedule()
    assert s.schedule() is None  # once per idle spell
