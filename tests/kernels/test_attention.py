"""Paged attention against a naive dense attention in float64, over mixed extend + decode batches."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from support.paged_case import Case

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


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("name", ["decodes", "mixed"])
def test_an_fp8_cache_is_read_as_the_activations_dtype(name: str, cache_dtype: torch.dtype) -> None:
    case = Case(BATCHES[name], 16, 6, 2).with_cache_dtype(cache_dtype)
    torch.testing.assert_close(case.run(), case.expected(), rtol=1e-10, atol=1e-10)


def test_an_fp8_cache_saturates_at_its_largest_value() -> None:
    case = Case(BATCHES["prefill"], 16, 4, 2).with_cache_dtype(torch.float8_e4m3fn)
    case.k[0] = case.k[0] * 1000  # past e4m3's 448
    case.run()
    stored = case.k_cache[case.page_table[0, 0], :7].double()
    assert stored.abs().max() == 448 and torch.equal(stored.sign(), case.k[0].sign())


@pytest.mark.parametrize("page_size", [1, 16])
def test_new_kv_lands_in_its_pages(page_size: int) -> None:
    case = Case(BATCHES["mixed"], page_size, 6, 2)
    case.run()
    for b, (prefix, extend) in enumerate(case.lens):
        for t in range(prefix + extend):
            page = case.page_table[b, t // page_size]
            assert torch.equal(case.k_cache[page, t % page_size], case.k[b][t])
            assert torch.equal(case.v_cache[page, t % page_size], case.v[b][t])


def test_metadata_without_gathered_rows_is_refused() -> None:
    case = Case(BATCHES["mixed"], 16, 4, 2)
    with pytest.raises(ValueError, match="gather_rows"):
        case.run(gather_rows=False)


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
