"""Paged attention against a naive dense attention in float64, over mixed extend + decode batches."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.kernels.attention import build_attention_metadata, paged_attention, store_kv

HEAD_DIM = 8


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """q ``[n, H, D]`` at positions prefix_len.., k/v ``[prefix_len + n, KV, D]``: dense softmax."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            keys = k[: prefix_len + i + 1, h // group]
            weights = torch.softmax(keys @ q[i, h] * HEAD_DIM**-0.5, dim=0)
            out[i, h] = weights @ v[: prefix_len + i + 1, h // group]
    return out


class Case:
    """A batch of requests (prefix_len, extend_len) with random K/V for every context token,
    the prefixes already in a shuffled page pool and the new tokens' K/V still to be stored."""

    def __init__(self, lens: list[tuple[int, int]], page_size: int, heads: int, kv_heads: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.lens, self.page_size = lens, page_size
        pages_per_req = [-(-(p + e) // page_size) for p, e in lens]
        num_pages = sum(pages_per_req) + 3
        order = list(range(num_pages))
        random.Random(seed).shuffle(order)
        self.page_table = torch.zeros(len(lens), max(pages_per_req), dtype=torch.int32)
        for b, n in enumerate(pages_per_req):
            self.page_table[b, :n] = torch.tensor([order.pop() for _ in range(n)])
        shape = (num_pages, page_size, kv_heads, HEAD_DIM)
        # unwritten rows hold noise, so reading a wrong row changes the result
        self.k_cache = torch.randn(shape, generator=gen, dtype=torch.float64)
        self.v_cache = torch.randn(shape, generator=gen, dtype=torch.float64)
        self.k = [torch.randn(p + e, kv_heads, HEAD_DIM, generator=gen, dtype=torch.float64) for p, e in lens]
        self.v = [torch.randn(p + e, kv_heads, HEAD_DIM, generator=gen, dtype=torch.float64) for p, e in lens]
        self.q = [torch.randn(e, heads, HEAD_DIM, generator=gen, dtype=torch.float64) for _, e in lens]
        for b, (prefix, _) in enumerate(lens):
            for t in range(prefix):
                page = self.page_table[b, t // page_size]
                self.k_cache[page, t % page_size] = self.k[b][t]
                self.v_cache[page, t % page_size] = self.v[b][t]

    def run(self) -> torch.Tensor:
        prefix = torch.tensor([p for p, _ in self.lens])
        extend = torch.tensor([e for _, e in self.lens])
        meta = build_attention_metadata(self.page_table, prefix, extend, self.page_size)
        new_k = torch.cat([k[p:] for k, (p, _) in zip(self.k, self.lens)])
        new_v = torch.cat([v[p:] for v, (p, _) in zip(self.v, self.lens)])
        store_kv(self.k_cache, self.v_cache, meta.slot_mapping, new_k, new_v)
        return paged_attention(torch.cat(self.q), self.k_cache, self.v_cache, meta, HEAD_DIM**-0.5)

    def expected(self) -> torch.Tensor:
        return torch.cat([naive_attention(q, k, v, p) for q, k, v, (p, _) in zip(self.q, self.k, self.v, self.lens)])


BATCHES = {
    "prefill": [(0, 7)],
    "prefix-inside-page": [(5, 9)],
    "prefix-on-page-boundary": [(16, 3), (32, 20)],
    "decodes": [(20, 1), (3, 1), (0, 1), (47, 1)],
    "mixed": [(0, 9), (17, 1), (16, 12), (5, 1), (31, 2)],
}


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (3, 1)])
def test_matches_dense_attention(name: str, page_size: int, heads: int, kv_heads: int) -> None:
    case = Case(BATCHES[name], page_size, heads, kv_heads)
    torch.testing.assert_close(case.run(), case.expected(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("page_size", [1, 16])
def test_new_kv_lands_in_its_pages(page_size: int) -> None:
    case = Case(BATCHES["mixed"], page_size, 6, 2)
    case.run()
    for b, (prefix, extend) in enumerate(case.lens):
        for t in range(prefix + extend):
            page = case.page_table[b, t // page_size]
            assert torch.equal(case.k_cache[page, t % page_size], case.k[b][t])
            assert torch.equal(case.v_cache[page, t % page_size], case.v[b][t])


@pytest.mark.parametrize("page_size", [1, 16])
def test_corrupted_page_table_changes_the_result(page_size: int) -> None:
    case = Case([(40, 3), (33, 1)], page_size, 6, 2)
    spare = next(page for page in range(case.k_cache.shape[0]) if page not in case.page_table)
    case.page_table[:, 0] = spare  # a page of noise instead of each request's first page
    assert not torch.allclose(case.run(), case.expected())


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20)), min_size=1, max_size=5),
    page_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_any_batch_matches_dense_attention(lens: list[tuple[int, int]], page_size: int, seed: int) -> None:
    case = Case(lens, page_size, 4, 2, seed)
    torch.testing.assert_close(case.run(), case.expected(), rtol=1e-10, atol=1e-10)
