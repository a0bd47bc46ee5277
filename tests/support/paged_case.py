"""A batch of requests over a shuffled page pool, with a dense-attention oracle: shared by the
torch-reference and Triton attention tests."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch

from radixcluster.kernels.attention import AttentionMetadata, build_attention_metadata, paged_attention, store_kv

StoreKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """q ``[n, H, D]`` at positions prefix_len.., k/v ``[prefix_len + n, KV, D]``: a dense,
    masked softmax over every head (K/V repeated for grouped-query heads)."""
    n, heads, head_dim = q.shape
    group = heads // k.shape[1]
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, keys) * head_dim**-0.5
    visible = torch.arange(k.shape[0])[None, :] <= (prefix_len + torch.arange(n))[:, None]
    weights = torch.softmax(scores.masked_fill(~visible.to(q.device), float("-inf")), dim=-1)
    return torch.einsum("hnl,lhd->nhd", weights, values)


class Case:
    """A batch of requests (prefix_len, extend_len) with random K/V for every context token,
    the prefixes already in a shuffled page pool and the new tokens' K/V still to be stored.
    ``groups`` lists (member requests, shared length): the members' first tokens, a whole
    number of pages within every member's prefix, live on the same pages, as the radix tree
    shares them. The same arguments give the same case; its tensors live on ``device``, its
    page table on the CPU (as the worker's mirror does)."""

    def __init__(
        self,
        lens: list[tuple[int, int]],
        page_size: int,
        heads: int,
        kv_heads: int,
        seed: int = 0,
        head_dim: int = 8,
        dtype: torch.dtype = torch.float64,
        device: str = "cpu",
        groups: list[tuple[list[int], int]] = (),
    ) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.page_size, self.head_dim, self.device = lens, page_size, head_dim, device
        self.groups = list(groups)
        pages_per_req = [-(-(p + e) // page_size) for p, e in lens]
        num_pages = sum(pages_per_req) + 3
        order = list(range(num_pages))
        random.Random(seed).shuffle(order)
        self.page_table = torch.zeros(len(lens), max(pages_per_req), dtype=torch.int32)
        for b, n in enumerate(pages_per_req):
            self.page_table[b, :n] = torch.tensor([order.pop() for _ in range(n)])
        shape = (num_pages, page_size, kv_heads, head_dim)
        # unwritten rows hold noise, so reading a wrong row changes the result
        self.k_cache = torch.randn(shape, generator=gen, dtype=dtype)
        self.v_cache = torch.randn(shape, generator=gen, dtype=dtype)
        self.k = [torch.randn(p + e, kv_heads, head_dim, generator=gen, dtype=dtype) for p, e in lens]
        self.v = [torch.randn(p + e, kv_heads, head_dim, generator=gen, dtype=dtype) for p, e in lens]
        self.q = [torch.randn(e, heads, head_dim, generator=gen, dtype=dtype) for _, e in lens]
        for members, shared in self.groups:
            assert shared % page_size == 0 and all(shared <= lens[b][0] for b in members)
            for b in members[1:]:
                self.page_table[b, : shared // page_size] = self.page_table[members[0], : shared // page_size]
                self.k[b][:shared], self.v[b][:shared] = self.k[members[0]][:shared], self.v[members[0]][:shared]
        for b, (prefix, _) in enumerate(lens):
            for t in range(prefix):
                page = self.page_table[b, t // page_size]
                self.k_cache[page, t % page_size] = self.k[b][t]
                self.v_cache[page, t % page_size] = self.v[b][t]
        self.k_cache, self.v_cache = self.k_cache.to(device), self.v_cache.to(device)
        self.k, self.v, self.q = ([x.to(device) for x in xs] for xs in (self.k, self.v, self.q))

    def with_cache_dtype(self, cache_dtype: torch.dtype) -> Case:
        """The case over caches of ``cache_dtype`` (an fp8 KV cache): every token's K/V rounded
        to it, so the oracle sees what the cache holds."""
        self.k, self.v = ([x.to(cache_dtype).to(x.dtype) for x in xs] for xs in (self.k, self.v))
        self.k_cache, self.v_cache = self.k_cache.to(cache_dtype), self.v_cache.to(cache_dtype)
        return self

    def metadata(self, gather_rows: bool = True) -> AttentionMetadata:
        prefix = torch.tensor([p for p, _ in self.lens])
        extend = torch.tensor([e for _, e in self.lens])
        group_of = np.full(len(self.lens), -1, dtype=np.int32)
        for g, (members, _) in enumerate(self.groups):
            group_of[members] = g
        return build_attention_metadata(
            self.page_table,
            prefix,
            extend,
            self.page_size,
            self.device,
            gather_rows=gather_rows,
            shared_groups=group_of if self.groups else None,
            shared_lens=np.array([n for _, n in self.groups], dtype=np.int32) if self.groups else None,
        )

    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The new tokens' K and V, ``[T, kv_heads, head_dim]`` each, in batch order."""
        new_k = torch.cat([k[p:] for k, (p, _) in zip(self.k, self.lens)])
        new_v = torch.cat([v[p:] for v, (p, _) in zip(self.v, self.lens)])
        return new_k, new_v

    def run(
        self, store: StoreKV = store_kv, attention: Attention = paged_attention, gather_rows: bool = True
    ) -> torch.Tensor:
        """Store the new K/V, then attend: the ``[T, heads, head_dim]`` output."""
        meta = self.metadata(gather_rows)
        store(self.k_cache, self.v_cache, meta.slot_mapping, *self.new_kv())
        return attention(torch.cat(self.q), self.k_cache, self.v_cache, meta, self.head_dim**-0.5)

    def expected(self) -> torch.Tensor:
        """Dense attention over the case's inputs, in float64, returned in the case's dtype."""
        parts = [
            naive_attention(q.double(), k.double(), v.double(), p)
            for q, k, v, (p, _) in zip(self.q, self.k, self.v, self.lens)
        ]
        return torch.cat(parts).to(self.q[0].dtype)
