"""Packs scheduled requests into a protocol.ForwardBatch: tokens, positions, page-table
deltas (only what the worker has not seen), the shared-prefix groups, the SamplingBatch and
the grammar mask."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from radixcluster.protocol import ForwardBatch, SamplingBatch
from radixcluster.router.cache.prefix_groups import prefix_groups
from radixcluster.router.request import Request


@dataclass(slots=True)
class ScheduledBatch:
    """One step: what goes to the worker, and the requests in its order."""

    forward: ForwardBatch
    requests: list[Request]
    is_prefill: bool


def build_forward(
    step_id: int,
    reqs: Sequence[Request],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    input_ids: np.ndarray | Sequence[int],
    positions: np.ndarray | Sequence[int],
    logprob_starts: Sequence[int] | None = None,
    logprob_next_ids: Sequence[int] | None = None,
) -> ForwardBatch:
    """Marks every request's table as synced: the caller sends this batch. Requests sharing a
    cached prefix are grouped from the tree nodes they hold locked (``prefix_groups``)."""
    t_slots, t_starts, t_counts, t_pages = [], [], [], []
    for r in reqs:
        n = len(r.pages)
        if r.synced_pages < n:
            t_slots.append(r.slot)
            t_starts.append(r.synced_pages)
            t_counts.append(n - r.synced_pages)
            t_pages.extend(r.pages[r.synced_pages :])
            r.synced_pages = n
    groups = prefix_groups([r.last_node for r in reqs], extend_lens)
    return ForwardBatch(
        step_id=step_id,
        input_ids=np.asarray(input_ids, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        slots=np.array([r.slot for r in reqs], dtype=np.int32),
        prefix_lens=np.array(prefix_lens, dtype=np.int32),
        extend_lens=np.array(extend_lens, dtype=np.int32),
        table_slots=np.array(t_slots, dtype=np.int32),
        table_starts=np.array(t_starts, dtype=np.int32),
        table_counts=np.array(t_counts, dtype=np.int32),
        table_pages=np.array(t_pages, dtype=np.int32),
        sampling=build_sampling(reqs),
        vocab_mask=build_vocab_mask(reqs, prefix_lens, extend_lens),
        logprob_starts=None if logprob_starts is None else np.array(logprob_starts, dtype=np.int32),
        logprob_next_ids=None if logprob_next_ids is None else np.array(logprob_next_ids, dtype=np.int32),
        prefix_groups=None if groups is None else groups[0],
        prefix_group_lens=None if groups is None else groups[1],
    )


def build_prefill(
    step_id: int, reqs: Sequence[Request], prefix_lens: Sequence[int], extend_lens: Sequence[int]
) -> ForwardBatch:
    """A prefill (extend) step: each request computes fill tokens [prefix, prefix + extend)."""
    ids, pos, starts, next_ids = [], [], [], []
    for r, prefix, extend in zip(reqs, prefix_lens, extend_lens):
        fill = r.fill_ids()
        ids.append(fill[prefix : prefix + extend])
        pos.append(np.arange(prefix, prefix + extend, dtype=np.int32))
        starts.append(_logprob_start(r, prefix, extend))
        # a chunk that ends inside the prompt scores the next chunk's first token as well
        end = prefix + extend
        next_ids.append(int(fill[end]) if starts[-1] >= 0 and end < r.prompt_len else -1)
    wanted = any(s >= 0 for s in starts)
    return build_forward(
        step_id,
        reqs,
        prefix_lens,
        extend_lens,
        np.concatenate(ids),
        np.concatenate(pos),
        starts if wanted else None,
        next_ids if wanted else None,
    )


def _logprob_start(req: Request, prefix_len: int, extend_len: int) -> int:
    """Index among this step's new tokens of the first prompt position whose logprob is wanted."""
    nxt = req.input_logprob_next
    if nxt >= req.prompt_len or nxt >= prefix_len + extend_len:
        return -1
    return max(nxt - prefix_len, 0)


def build_sampling(reqs: Sequence[Request]) -> SamplingBatch:
    floats = np.array([r.float_row for r in reqs], dtype=np.float32).reshape(len(reqs), 6)
    ints = np.array([r.int_row for r in reqs], dtype=np.int64).reshape(len(reqs), 3)
    penalized = [r.output_ids if r.has_penalty else () for r in reqs]
    penalty_ids = [t for ids in penalized for t in ids]
    biases = [r.step_bias() for r in reqs]
    biased = [bias for bias in biases if bias[0].size]
    repeated = [r for r in reqs if r.prompt_vocab.size]
    return SamplingBatch(
        temperature=floats[:, 0].copy(),
        top_p=floats[:, 1].copy(),
        top_k=ints[:, 0].astype(np.int32),
        min_p=floats[:, 2].copy(),
        frequency_penalty=floats[:, 3].copy(),
        presence_penalty=floats[:, 4].copy(),
        repetition_penalty=floats[:, 5].copy(),
        seed=ints[:, 1].copy(),
        penalty_ids=np.array(penalty_ids, dtype=np.int32),
        penalty_lens=np.array([len(ids) for ids in penalized], dtype=np.int32),
        prompt_penalty_ids=np.concatenate([r.prompt_vocab for r in repeated]) if repeated else np.zeros(0, np.int32),
        prompt_penalty_lens=np.array([r.prompt_vocab.size for r in reqs], dtype=np.int32),
        top_logprobs_num=ints[:, 2].astype(np.int32),
        bias_ids=np.concatenate([ids for ids, _ in biased]) if biased else np.zeros(0, np.int32),
        bias_values=np.concatenate([values for _, values in biased]) if biased else np.zeros(0, np.float32),
        bias_lens=np.array([ids.size for ids, _ in biases], dtype=np.int32),
        return_logprob=any(r.return_logprob for r in reqs),
    )


def build_vocab_mask(
    reqs: Sequence[Request], prefix_lens: Sequence[int], extend_lens: Sequence[int]
) -> np.ndarray | None:
    """The step's int32 [B, W] bitmask (``ForwardBatch.vocab_mask``): a grammar request that
    samples this step (a decode, or its last prefill chunk) gets its matcher's row, every other
    row allows all tokens (a grammar held back while its model thinks, mostly, too). None, the
    fast path, when no sampling request's row needs one."""
    rows = [
        (i, r.grammar)
        for i, (r, prefix, extend) in enumerate(zip(reqs, prefix_lens, extend_lens))
        if r.grammar is not None and r.grammar.masks and prefix + extend == r.fill_len
    ]
    if not rows:
        return None
    mask = np.full((len(reqs), rows[0][1].mask_width), -1, dtype=np.int32)
    for i, grammar in rows:
        grammar.fill(mask, i)
    return mask
