"""Continuous batching: each step is a prefill batch (new requests, chunked under a token
budget, ordered by policy) that every running request joins with its next token (a mixed
step: the weights are read once for both), or a decode batch of every running request.

Step loop of the router process::

    batch = scheduler.schedule()          # None: nothing to do
    result = <send batch.forward, wait for the StepResult>
    for req in scheduler.process_result(batch, result): ...   # stream, check stop strings
    scheduler.finish_request(rid, reason) # stop string matched (before the next schedule)

Only this class (through CacheManager) mutates requests' KV state, the tree and the pool.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from radixcluster.block_hash import tenant_namespace
from radixcluster.protocol import StepResult
from radixcluster.router.batch_builder import ScheduledBatch, build_forward, build_prefill
from radixcluster.router.cache.cache_manager import CacheManager
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.pin_table import PinRefused
from radixcluster.router.cache.radix_tree import RadixTree, TreeEventHook
from radixcluster.router.cache.slot_pool import SlotPool
from radixcluster.router.prefill_admission import Admit, PrefillAdmission, PrefillEntry, reserve_pages
from radixcluster.router.request import ReqState, Request
from radixcluster.router.result_processing import apply_token, record_input_logprobs
from radixcluster.router.schedule_policy import SchedulePolicy
from radixcluster.router.scheduler_stats import (
    CACHE_INFO_KEYS,
    SchedulerStats,
    check_idle_pool,
    check_pool_integrity,
)
from radixcluster.router.tenant_quota import TenantQuota

logger = logging.getLogger(__name__)

# expected fraction of remaining new tokens a running request will still decode: held back
# from admission; raised after a retraction, decayed every decode step; the first and the least
# are scaled by SGLang's --schedule-conservativeness (at most all of them)
INIT_RESERVE_RATIO = 0.7
MIN_RESERVE_RATIO = 0.1
RESERVE_DECAY_PER_STEP = 0.001
RETRACT_RESERVE_BUMP = 0.3
NO_QUOTA = TenantQuota()


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    num_pages: int
    page_size: int
    max_running_requests: int
    chunked_prefill_size: int
    max_context_len: int
    schedule_policy: str = "lpm"
    enable_radix_cache: bool = True
    eviction_policy: str = "lru"
    max_pinned_fraction: float = 0.5  # of the pool, the most that pins may hold
    tenant_quotas: dict[str, TenantQuota] = field(default_factory=dict)
    schedule_conservativeness: float = 1.0

    def __post_init__(self) -> None:
        if self.schedule_conservativeness <= 0:
            raise ValueError(f"schedule_conservativeness must be positive, got {self.schedule_conservativeness}")
        for name in ("num_pages", "page_size", "max_running_requests", "max_context_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 <= self.max_pinned_fraction <= 1:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got {self.max_pinned_fraction}")
        if self.chunked_prefill_size < self.page_size:
            raise ValueError("chunked_prefill_size must be at least one page")


class Scheduler:
    def __init__(self, config: SchedulerConfig, on_tree_event: TreeEventHook | None = None) -> None:
        self.config = config
        self.allocator = PageAllocator(config.num_pages)
        tree = RadixTree(self.allocator, config.page_size, config.eviction_policy, on_tree_event)
        max_pinned = int(config.max_pinned_fraction * config.num_pages) * config.page_size
        self.cache = CacheManager(self.allocator, tree, config.enable_radix_cache, max_pinned)
        self.policy = SchedulePolicy(config.schedule_policy, self.cache)
        self.slots = SlotPool(config.max_running_requests)
        self.waiting: list[Request] = []
        self.running: list[Request] = []  # decoding, in admission order
        # admitted, prefill not finished: the batch in flight, or between steps the chunked one
        self.prefilling: list[Request] = []
        self.reqs: dict[str, Request] = {}
        self.counters = SchedulerStats()
        self.min_reserve_ratio = min(1.0, MIN_RESERVE_RATIO * config.schedule_conservativeness)
        self.reserve_ratio = min(1.0, INIT_RESERVE_RATIO * config.schedule_conservativeness)
        self._step_id = 0
        self._admit_seq = 0
        self._idle_checked = True

    @property
    def tree(self) -> RadixTree:
        return self.cache.tree

    # ------------------------------------------------------------ requests in and out

    def add_request(self, req: Request) -> None:
        """Queue a new request; raises ValueError if it can never run here."""
        cfg = self.config
        if req.rid in self.reqs:
            raise ValueError(f"duplicate request id {req.rid!r}")
        gen = req.sampling.max_new_tokens
        if req.prompt_len + (1 if gen else 0) > cfg.max_context_len:
            raise ValueError(f"prompt of {req.prompt_len} tokens leaves no room in a context of {cfg.max_context_len}")
        total = min(req.prompt_len + gen, cfg.max_context_len)
        if -(-total // cfg.page_size) > cfg.num_pages:
            raise ValueError(f"{total} tokens do not fit the KV pool ({cfg.num_pages} pages of {cfg.page_size})")
        self.reqs[req.rid] = req
        self.waiting.append(req)
        self._idle_checked = False

    def finish_request(self, rid: str, reason: dict[str, Any]) -> bool:
        """Finish a request now (a stop string matched); what it computed stays cached."""
        return self._end(rid, reason, publish=True)

    def abort_request(self, rid: str, message: str = "aborted") -> bool:
        """Drop a waiting or running request and release its locks and private pages."""
        return self._end(rid, {"type": "abort", "message": message}, publish=False)

    def _end(self, rid: str, reason: dict[str, Any], publish: bool) -> bool:
        req = self.reqs.get(rid)
        if req is None:
            return False
        if req.state is ReqState.WAITING:
            self.waiting.remove(req)
        elif req.state is ReqState.PREFILLING:
            self.prefilling.remove(req)
        else:
            self.running.remove(req)
        self._finish(req, reason, publish)
        return True

    def _finish(self, req: Request, reason: dict[str, Any], publish: bool) -> None:
        self.cache.release(req, publish)
        self._trim_to_cache_quota(req.tenant)
        if req.slot >= 0:
            self.slots.free(req.slot)
            req.slot = -1
        req.state = ReqState.FINISHED
        req.finish_reason = reason
        self.reqs.pop(req.rid, None)

    # ------------------------------------------------------------ scheduling

    def is_idle(self) -> bool:
        return not self.waiting and not self.running and not self.prefilling

    def schedule(self) -> ScheduledBatch | None:
        """The next step to run, or None when there is nothing to do (the pool's counts are
        checked then). Pins whose TTL ended are released first (the router calls this on every
        loop turn)."""
        self.cache.pins.expire(time.monotonic())
        batch = self._schedule_prefill() or self._schedule_decode()
        # nothing runs, so the pins hold what the queue's head needs (it fits the pool, or intake
        # would have refused it)
        while batch is None and (self.waiting or self.prefilling) and not self.running and self._release_a_pin():
            batch = self._schedule_prefill() or self._schedule_decode()
        if batch is None and self.is_idle() and not self._idle_checked:
            self._idle_checked = True  # once per idle spell, even when it raises
            # counters only: the full check walks the tree in Python (84 ms at 32k nodes), in
            # the way of the next request; it runs at every flush and in the tests
            check_idle_pool(self.cache)
        return batch

    def _schedule_prefill(self) -> ScheduledBatch | None:
        if not self.waiting and not self.prefilling:
            return None
        decoding = self.running
        riders = self._give_decode_pages()
        adm = PrefillAdmission(
            self.cache,
            self.policy,
            token_budget=self.config.chunked_prefill_size,
            reserved_pages=reserve_pages(decoding, self.reserve_ratio, self.config.page_size),
            reserve_ratio=self.reserve_ratio,
            alone=not decoding and not self.prefilling,
        )
        for chunked in self.prefilling:
            if not adm.continue_chunked(chunked):
                return None
        free_slots = self.config.max_running_requests - len(decoding) - len(self.prefilling)
        admitted: list[Request] = []
        # admitted requests per tenant, counted only when some tenant has a running quota
        running = Counter(r.tenant for r in decoding + self.prefilling) if self.config.tenant_quotas else Counter()
        for req in self.policy.order(self.waiting) if free_slots > 0 else ():
            if len(admitted) == free_slots or adm.token_budget <= 0:
                break
            if self._at_running_quota(req.tenant, running[req.tenant]):
                continue  # it waits; other tenants' requests go past it
            outcome = adm.try_add(req)
            if outcome is Admit.STOP:
                break
            if outcome is Admit.ADDED:
                admitted.append(req)
                running[req.tenant] += 1
        if not adm.entries:
            return None
        if admitted:
            taken = set(r.rid for r in admitted)
            self.waiting = [r for r in self.waiting if r.rid not in taken]
        for entry in adm.entries:
            self._start_prefill(entry.req, entry.prefix_len, entry.first_admission)
        self.prefilling = [e.req for e in adm.entries]
        return self._build(adm.entries, riders)

    def _quota(self, tenant: str | None) -> TenantQuota:
        return self.config.tenant_quotas.get(tenant, NO_QUOTA) if tenant is not None else NO_QUOTA

    def _at_running_quota(self, tenant: str | None, running: int) -> bool:
        limit = self._quota(tenant).max_running_requests
        return limit is not None and running >= limit

    def _start_prefill(self, req: Request, prefix_len: int, first_admission: bool) -> None:
        if req.state is ReqState.PREFILLING:
            return
        req.state = ReqState.PREFILLING
        req.slot = self.slots.alloc()
        req.admit_seq = self._admit_seq
        self._admit_seq += 1
        if first_admission:
            req.admitted_once = True
            req.cached_tokens = prefix_len
            if req.log_metrics:
                self.counters.count_admission(req.prompt_len, prefix_len, req.tenant)

    def _build(self, entries: list[PrefillEntry], riders: list[Request]) -> ScheduledBatch:
        """The prefill entries, then the running requests riding along with their next token."""
        self._step_id += 1
        reqs = [e.req for e in entries] + riders
        prefix_lens = [e.prefix_len for e in entries] + [r.num_computed for r in riders]
        extend_lens = [e.extend_len for e in entries] + [1] * len(riders)
        if riders:
            self._decay_reserve()
        forward = build_prefill(self._step_id, reqs, prefix_lens, extend_lens)
        return ScheduledBatch(forward, reqs, is_prefill=True)

    def _give_decode_pages(self) -> list[Request]:
        """Every running request gets the page its next token goes to (before admission takes
        any); returns them, ready to step. Empty when the pool cannot hold those tokens: then a
        prefill runs without them, and a decode step retracts."""
        ps = self.config.page_size
        need = sum(1 for r in self.running if len(r.pages) * ps <= r.num_computed)
        if not self.running or not self.cache.make_room(need):
            return []
        fresh = iter(self.allocator.alloc(need).tolist())
        for r in self.running:
            if len(r.pages) * ps <= r.num_computed:
                r.pages.append(next(fresh))
        return list(self.running)

    def _decay_reserve(self) -> None:
        self.reserve_ratio = max(self.min_reserve_ratio, self.reserve_ratio - RESERVE_DECAY_PER_STEP)

    def _schedule_decode(self) -> ScheduledBatch | None:
        reqs = self._give_decode_pages()
        while self.running and not reqs:
            self._retract_youngest()
            reqs = self._give_decode_pages()
        if not reqs:
            return None
        ids = [r.output_ids[-1] for r in reqs]
        pos = [r.num_computed for r in reqs]
        self._decay_reserve()
        self._step_id += 1
        forward = build_forward(self._step_id, reqs, pos, [1] * len(reqs), ids, pos)
        return ScheduledBatch(forward, reqs, is_prefill=False)

    def _release_a_pin(self) -> bool:
        """Pins give way to a request that cannot run beside them, the one due first first;
        False when none is left."""
        pin = self.cache.pins.release_soonest()
        if pin is not None:
            logger.warning("a pin of %d tokens was released: a request could not run beside it", pin.tokens)
        return pin is not None

    def _retract_youngest(self) -> None:
        """Give a running request's private pages back; its tokens go to the queue front. The
        last one left keeps running: pins give way to it."""
        candidates = self.running + self.prefilling
        if len(candidates) == 1 and self._release_a_pin():
            return
        if len(candidates) == 1:
            raise RuntimeError("the KV pool cannot hold a single request (add_request should have refused it)")
        victim = max(candidates, key=lambda r: r.admit_seq)
        (self.prefilling if victim.state is ReqState.PREFILLING else self.running).remove(victim)
        self._unadmit(victim)
        victim.retractions += 1
        self.waiting.insert(0, victim)
        self.counters.retractions_total += 1
        self.reserve_ratio = min(1.0, self.reserve_ratio + RETRACT_RESERVE_BUMP)
        logger.info("retracted %s (%d tokens computed so far)", victim.rid, victim.fill_len - 1)

    def _unadmit(self, req: Request) -> None:
        """Back to waiting: its KV (private pages, tree locks, slot) given up; it keeps every
        token it has, to recompute them when admitted again."""
        self.cache.release(req, publish=False)
        self.slots.free(req.slot)
        req.slot = -1
        req.state = ReqState.WAITING

    def requeue_all(self) -> list[Request]:
        """The KV pool is lost (the TP group is replaced): every admitted request goes back to the
        front of the queue, in admission order, to recompute its prompt and the tokens it has
        streamed; the tree, whose pages held that KV, empties, pins included. Returns the
        re-queued requests."""
        admitted = sorted(self.running + self.prefilling, key=lambda r: r.admit_seq)
        for req in admitted:
            self._unadmit(req)
        self.running, self.prefilling = [], []
        self.waiting[:0] = admitted
        self._empty_cache()
        self._idle_checked = False
        return admitted

    def _pin_prompt(self, req: Request) -> None:
        """Pin the prefixes the request asked for, now that its prompt is in the tree (again
        after a retraction or a lost group: the TTL restarts). A refused pin costs the request
        nothing: it is logged, and ``pinned_tokens`` says what was pinned."""
        if not req.pins:
            return
        now, pinned = time.monotonic(), []
        for tokens, ttl_s in req.pins:
            try:
                pinned.append(self.cache.pin(tokens, req.cache_salt, ttl_s, now))
            except PinRefused as exc:
                logger.warning("request %s: its pin of %d tokens was refused: %s", req.rid, len(tokens), exc)
        req.pinned_tokens = max((p.tokens for p in pinned), default=0)

    def _trim_to_cache_quota(self, tenant: str | None) -> None:
        """A tenant over its max_cached_tokens evicts its own unlocked runs (by policy) down to
        it; what its running requests and pins hold stays, so the quota binds once they end."""
        limit = self._quota(tenant).max_cached_tokens
        if tenant is None or limit is None:
            return
        namespace = tenant_namespace(tenant)
        over = self.tree.namespace_tokens(namespace) - limit
        if over > 0:
            self.tree.evict_namespace(namespace, over)

    # ------------------------------------------------------------ results

    def process_result(self, batch: ScheduledBatch, result: StepResult) -> list[Request]:
        """Apply a step's result: publish computed KV, append tokens, finish and release.

        Returns the requests that got a token or finished in this step, in batch order
        (requests aborted while the step ran are skipped).
        """
        fwd = batch.forward
        if result.step_id != fwd.step_id:
            raise ValueError(f"result of step {result.step_id} for batch {fwd.step_id}")
        extend_lens = fwd.extend_lens.tolist()
        tokens = result.next_token_ids.tolist()
        record_input_logprobs(batch, result)
        touched: list[Request] = []
        became_running: list[Request] = []
        for i, req in enumerate(batch.requests):
            if req.finished:
                continue
            req.num_computed += extend_lens[i]
            if req.state is ReqState.PREFILLING:
                self.cache.publish(req)
                self._trim_to_cache_quota(req.tenant)
                if req.num_computed < req.fill_len:
                    continue  # a chunk: its sampled token is ignored
                self._pin_prompt(req)
                if req.sampling.max_new_tokens == 0:
                    self._finish(req, {"type": "length", "length": 0}, publish=True)
                    touched.append(req)
                    continue
                req.state = ReqState.RUNNING
                became_running.append(req)
            reason = apply_token(req, tokens[i], i, result, self.config.max_context_len)
            if reason is not None:
                self._finish(req, reason, publish=True)
            touched.append(req)
        self.running = [r for r in self.running if not r.finished] + [r for r in became_running if not r.finished]
        if batch.is_prefill:
            self.prefilling = [r for r in self.prefilling if r.state is ReqState.PREFILLING]
        return touched

    # ------------------------------------------------------------ cache control and checks

    def flush_cache(self) -> bool:
        """Empty the tree, pins included; refused (False) unless the scheduler is idle."""
        if not self.is_idle():
            return False
        self._empty_cache()
        self.check_integrity()
        return True

    def _empty_cache(self) -> None:
        self.cache.pins.clear()  # a pin holds a lock on the tree
        self.tree.reset()

    def check_integrity(self) -> None:
        """Every page free xor owned by one tree node or one admitted request; raises IntegrityError."""
        check_pool_integrity(self.cache, self.running + self.prefilling, idle=self.is_idle())

    def stats(self) -> dict[str, Any]:
        """Counters and gauges for /metrics (counters are monotonic, never reset by a flush)."""
        admitted = self.running + self.prefilling
        # prompt work still ahead: what admitted requests have not computed, all that waits
        tokens = (sum(r.fill_len - r.num_computed for r in self.prefilling), sum(r.fill_len for r in self.waiting))
        stats = self.counters.snapshot(self.cache, len(admitted), len(self.waiting), *tokens)
        for name, entry in stats["tenants"].items():
            entry["cached_tokens"] = self.tree.namespace_tokens(tenant_namespace(name))
        return stats

    def cache_info(self, tenant: str | None = None) -> dict[str, Any]:
        """The radix-cache part of ``stats()`` and the pins, for /cache_info; asked for a
        ``tenant``, only its own entry of ``tenants`` and its own pins (the totals name nobody)."""
        info = {k: v for k, v in self.stats().items() if k in CACHE_INFO_KEYS}
        pins = self.cache.pins.describe(time.monotonic(), None if tenant is None else tenant_namespace(tenant))
        if tenant is not None:
            info["tenants"] = {name: v for name, v in info["tenants"].items() if name == tenant}
        return {**info, "pins": pins}
