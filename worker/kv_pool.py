"""This rank's physical KV cache (every layer's K and V pages) and its mirror of the router's
page tables. The router allocates pages; the pool only stores what it is told."""

from __future__ import annotations

import numpy as np
import torch

from radixcluster.protocol import ForwardBatch


class KVPool:
    """Per layer, K and V of shape ``[num_pages, page_size, num_kv_heads, head_dim]`` (this
    rank's KV heads), and ``page_table``: int32 ``[max_slots, max_pages_per_request]`` on the
    CPU, where the per-step attention layout is computed."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_slots: int,
        max_pages_per_request: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.page_size = page_size
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        # empty, not zeros: untouched pages of a large pool then cost no memory. Attention reads
        # only written rows, plus row 0 as masked padding, which must hold no NaN (0 * NaN).
        self.k = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for cache in (*self.k, *self.v):
            cache[0].zero_()
        self.page_table = torch.zeros(max_slots, max_pages_per_request, dtype=torch.int32)

    def apply_deltas(self, batch: ForwardBatch) -> None:
        """Copy the batch's page-table deltas into the mirror, in order (a later delta wins)."""
        table = self.page_table.numpy()
        ends = np.cumsum(batch.table_counts, dtype=np.int64)
        for slot, start, count, end in zip(
            batch.table_slots.tolist(), batch.table_starts.tolist(), batch.table_counts.tolist(), ends.tolist()
        ):
            table[slot, start : start + count] = batch.table_pages[end - count : end]

    def rows(self, slots: np.ndarray) -> torch.Tensor:
        """The page-table rows of ``slots`` (int32 ``[B, max_pages_per_request]``, a copy)."""
        return self.page_table[torch.from_numpy(np.asarray(slots, dtype=np.int64))]
