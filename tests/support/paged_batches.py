"""Plays the router's part in worker tests and benchmarks: hands out KV pages to slots (in a
shuffled order, so page tables are not the identity) and builds ForwardBatches."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from radixcluster.protocol import ForwardBatch, SamplingBatch


def greedy_sampling(batch_size: int) -> SamplingBatch:
    """Greedy sampling parameters for ``batch_size`` requests."""
    ones = np.ones(batch_size, dtype=np.float32)
    return SamplingBatch(
        temperature=0 * ones,
        top_p=ones,
        top_k=np.full(batch_size, -1, dtype=np.int32),
        min_p=0 * ones,
        frequency_penalty=0 * ones,
        presence_penalty=0 * ones,
        repetition_penalty=ones,
        seed=np.full(batch_size, -1, dtype=np.int64),
        penalty_ids=np.zeros(0, dtype=np.int32),
        penalty_lens=np.zeros(batch_size, dtype=np.int32),
        prompt_penalty_ids=np.zeros(0, dtype=np.int32),
        prompt_penalty_lens=np.zeros(batch_size, dtype=np.int32),
        top_logprobs_num=np.zeros(batch_size, dtype=np.int32),
        bias_ids=np.zeros(0, dtype=np.int32),
        bias_values=np.zeros(0, dtype=np.float32),
        bias_lens=np.zeros(batch_size, dtype=np.int32),
    )


@dataclass(slots=True)
class Extend:
    """New tokens of one request after ``prefix_len`` tokens already in its slot's pages."""

    slot: int
    token_ids: list[int]
    prefix_len: int
    logprob_start: int = -1
    logprob_next_id: int = -1  # the prompt token after these (a chunk), scored at the last


class PageBook:
    """Each slot's pages, and which of them the worker's mirror has not seen yet."""

    def __init__(self, page_size: int, num_pages: int, seed: int = 0) -> None:
        self.page_size = page_size
        self.free = list(range(num_pages))
        random.Random(seed).shuffle(self.free)
        self.pages: dict[int, list[int]] = {}
        self.synced: dict[int, int] = {}
        self.step_id = 0

    def share(self, src_slot: int, dst_slot: int, num_tokens: int) -> None:
        """``dst_slot`` starts with the pages holding ``src_slot``'s first ``num_tokens``
        tokens (a cached prefix; whole pages only, as the radix tree shares them)."""
        assert num_tokens % self.page_size == 0
        self.pages[dst_slot] = self.pages[src_slot][: num_tokens // self.page_size]
        self.synced[dst_slot] = 0

    def batch(self, requests: list[Extend]) -> ForwardBatch:
        """A batch of these requests, allocating the pages their new tokens need."""
        table_slots, table_starts, table_counts, table_pages = [], [], [], []
        for req in requests:
            pages = self.pages.setdefault(req.slot, [])
            needed = -(-(req.prefix_len + len(req.token_ids)) // self.page_size)
            pages.extend(self.free.pop() for _ in range(needed - len(pages)))
            synced = self.synced.get(req.slot, 0)
            if synced < len(pages):
                table_slots.append(req.slot)
                table_starts.append(synced)
                table_counts.append(len(pages) - synced)
                table_pages.extend(pages[synced:])
                self.synced[req.slot] = len(pages)
        self.step_id += 1
        i32 = lambda values: np.asarray(values, dtype=np.int32)  # noqa: E731
        scored = any(r.logprob_start >= 0 for r in requests)
        return ForwardBatch(
            step_id=self.step_id,
            input_ids=i32([t for r in requests for t in r.token_ids]),
            positions=i32([p for r in requests for p in range(r.prefix_len, r.prefix_len + len(r.token_ids))]),
            slots=i32([r.slot for r in requests]),
            prefix_lens=i32([r.prefix_len for r in requests]),
            extend_lens=i32([len(r.token_ids) for r in requests]),
            table_slots=i32(table_slots),
            table_starts=i32(table_starts),
            table_counts=i32(table_counts),
            table_pages=i32(table_pages),
            sampling=greedy_sampling(len(requests)),
            logprob_starts=i32([r.logprob_start for r in requests]) if scored else None,
            logprob_next_ids=i32([r.logprob_next_id for r in requests]) if scored else None,
        )
