"""The shared-prefix workload's steps as the worker sees them (PEERS.md: groups of requests
sharing a ~620-token system prompt, a 24-token question each, then decoding), laid out in the
KV pool as the router's allocator lays them out: each group's prefix on consecutive pages,
each question after it, then one page per request per decoded token, interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Workload:
    groups: int = 8
    per_group: int = 4
    shared: int = 620
    question: int = 24
    decoded: int = 16  # tokens each request has decoded before the measured step

    @property
    def batch(self) -> int:
        return self.groups * self.per_group

    @property
    def context(self) -> int:
        """Tokens in the cache before the measured decode step."""
        return self.shared + self.question + self.decoded

    @property
    def rows(self) -> int:
        """Cache rows (page size 1) the workload fills, row 0 left unused."""
        return 1 + self.groups * self.shared + self.batch * (self.question + self.decoded + 1)


def decode_tables(w: Workload) -> np.ndarray:
    """int32 ``[batch, context + 1]``: each request's cache row of every token up to and
    including the one the measured step writes (page size 1)."""
    table = np.zeros((w.batch, w.context + 1), dtype=np.int32)
    row = 1
    for g in range(w.groups):
        prefix = np.arange(row, row + w.shared)
        row += w.shared
        for m in range(w.per_group):
            b = g * w.per_group + m
            table[b, : w.shared] = prefix
            table[b, w.shared : w.shared + w.question] = np.arange(row, row + w.question)
            row += w.question
    for t in range(w.decoded + 1):
        table[:, w.shared + w.question + t] = np.arange(row, row + w.batch)
        row += w.batch
    return table


def groups_of(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    """``ForwardBatch.prefix_groups`` and ``prefix_group_lens`` of the decode batch."""
    return (
        np.repeat(np.arange(w.groups, dtype=np.int32), w.per_group),
        np.full(w.groups, w.shared, dtype=np.int32),
    )
