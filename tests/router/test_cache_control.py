"""The router's cache page and cache-control answers on the real tokenizer, scheduler and model
runner: the tree snapshot (with and without text), pins, and eviction by prefix."""

from __future__ import annotations

import itertools

import pytest

from radixcluster.block_hash import ForgedSalt, tenant_salt
from radixcluster.protocol import ControlRequest, ControlResponse, GenerateRequest, SamplingParams
from radixcluster.router.router_process import Router
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from support.router_configs import in_process_router_config

PAGES = 512
HEADER = "You are a careful assistant. Answer briefly and precisely." * 3
# a text prefix is tokenized alone: it names the runs of a longer prompt when it ends where a
# token of that prompt ends (here before " What", not inside it)
_ids = itertools.count()


@pytest.fixture(scope="module")
def runner(model_path) -> ModelRunner:
    return ModelRunner(
        RunnerConfig(model_path=model_path, num_pages=PAGES, page_size=1, max_slots=4, max_context_len=2048)
    )


def make_router(model_path, **overrides) -> Router:
    limits = dict(
        num_pages=PAGES,
        context_length=2048,
        max_running_requests=4,
        chunked_prefill_size=256,
        max_queued_requests=16,
    )
    return Router(in_process_router_config(model_path, **{**limits, **overrides}))


def generate(router: Router, runner: ModelRunner, text: str) -> int:
    """Run ``text`` to its end (2 new tokens); its cached_tokens."""
    rid = f"g{next(_ids)}"
    outs = router.submit(GenerateRequest(rid=rid, text=text, sampling=SamplingParams(max_new_tokens=2, temperature=0)))
    while not any(o.finished for o in outs):
        outs += router.step(runner.step)
    router.scheduler.check_integrity()
    return outs[-1].cached_tokens


def control(router: Router, kind: str, **args) -> ControlResponse:
    (answer,) = router.submit(ControlRequest(cid="c", kind=kind, args=args))
    assert isinstance(answer, ControlResponse)
    return answer


def test_the_tree_snapshot_shows_the_shared_prefix_and_text_only_when_asked(model_path, runner):
    router = make_router(model_path)
    generate(router, runner, HEADER + " What is 2+2?")
    generate(router, runner, HEADER + " What is 3+3?")
    snap = control(router, "cache_tree", depth=4, min_tokens=0).payload
    (shared,) = snap["root"]["children"]
    assert shared["hits"] >= 1 and len(shared["children"]) == 2 and "text" not in shared
    assert snap["root"]["subtree_tokens"] == router.scheduler.tree.cached_tokens
    assert "depth" in control(router, "cache_tree", depth=0).error
    texts = make_router(model_path, cache_page_text=True)
    generate(texts, runner, HEADER + " What is 2+2?")
    assert control(texts, "cache_tree").payload["root"]["children"][0]["text"].startswith("You are")


def test_a_pin_keeps_its_prefix_through_eviction_and_evict_by_prefix_frees_the_rest(model_path, runner):
    router = make_router(model_path, max_pinned_fraction=0.25)
    prompt = HEADER + " What is 2+2?"
    generate(router, runner, prompt)
    generate(router, runner, "A different prompt about rivers and mountains.")
    pinned = control(router, "cache_pin", text=prompt, ttl_s=60).payload
    assert pinned["tokens"] >= 30 and pinned["pinned_tokens"] == pinned["tokens"]
    info = control(router, "cache_info").payload
    assert info["pinned_tokens"] == pinned["tokens"] and [p["id"] for p in info["pins"]] == [pinned["id"]]
    control(router, "cache_evict", text=HEADER)  # frees what lies beyond the pinned run, never the run
    assert router.scheduler.tree.protected_tokens == pinned["tokens"]
    router.scheduler.tree.evict(PAGES)
    assert router.scheduler.tree.cached_tokens == pinned["tokens"]
    assert generate(router, runner, prompt) == pinned["prompt_tokens"] - 1
    over = control(router, "cache_pin", input_ids=list(range(100, 300)), ttl_s=5)
    assert over.error is not None and "nothing of this prefix is cached" in over.error
    assert control(router, "cache_unpin", text=prompt).payload == {"unpinned": True, "tokens": pinned["tokens"]}
    assert control(router, "cache_unpin", text=prompt).payload["unpinned"] is False
    before = router.scheduler.tree.cached_tokens
    freed = control(router, "cache_evict", text=HEADER).payload["evicted_tokens"]
    assert 0 < freed <= before and router.scheduler.tree.cached_tokens == before - freed
    router.scheduler.check_integrity()


def test_the_pin_bound_refuses_with_a_message(model_path, runner):
    router = make_router(model_path, max_pinned_fraction=0.02)  # 10 of the 512 tokens
    generate(router, runner, HEADER)
    refused = control(router, "cache_pin", text=HEADER, ttl_s=5)
    assert refused.error is not None and "--max-pinned-fraction" in refused.error
    assert router.scheduler.tree.protected_tokens == 0


def test_a_tenant_salt_cannot_be_forged_without_the_tenant():
    alpha = tenant_salt("alpha", "x")
    assert alpha != tenant_salt("beta", "x") and alpha != tenant_salt("alpha", None)
    assert tenant_salt(None, "plain") == "plain"
    with pytest.raises(ForgedSalt, match="cache_salt"):
        tenant_salt(None, alpha)
