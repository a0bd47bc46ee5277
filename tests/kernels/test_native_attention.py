"""The native paged attention against a dense float64 oracle, for every shape class and on every
instruction set this CPU runs; its plan (shared prefixes read once per group, long contexts
split across threads) checked directly."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.kernels import native
from radixcluster.kernels.native_attention import native_paged_attention, native_plan
from radixcluster.kernels.native_ops import native_store_kv
from support.paged_case import Case

HEAD_DIM = 64
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}
BATCHES = {
    "prefill": ([(0, 7)], []),
    "long-prefill-many-tiles": ([(0, 150)], []),
    "prefix-inside-page": ([(5, 9)], []),
    "prefix-on-page-boundary": ([(16, 3), (32, 20)], []),
    "decodes": ([(20, 1), (3, 1), (0, 1), (47, 1)], []),
    "mixed": ([(0, 9), (17, 1), (16, 12), (5, 1), (31, 2)], []),
    "full-prefix": ([(79, 1)], []),
    "shared-decodes": ([(32, 1), (40, 1), (33, 1), (50, 1)], [([0, 1, 2, 3], 32)]),
    "two-groups-and-a-loner": ([(32, 1), (40, 1), (48, 1), (50, 1), (20, 1)], [([0, 1], 32), ([2, 3], 48)]),
    "group-of-one": ([(32, 1), (40, 1)], [([1], 32)]),
    "shared-extends": ([(32, 5), (40, 1), (33, 20), (50, 1)], [([0, 2, 3], 32)]),
    "whole-prefix-shared": ([(64, 1), (64, 3)], [([0, 1], 64)]),
}
HEADS = [(4, 4), (9, 3), (8, 1)]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]  # query heads per KV head: 1, 3, 8


@pytest.fixture(scope="module", autouse=True)
def kernels() -> str:
    return native.load()


@pytest.fixture(params=["amx", "avx512bf16", "avx512", "avx2", "scalar"])
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each instruction set the kernels are built for, forced in turn where this CPU runs it."""
    yield from forced_isa(request.param)


def forced_isa(name: str) -> Iterator[str]:
    if name not in torch.ops.radixcluster.supported_isas():
        pytest.skip(f"this CPU does not run {name}")
    default = torch.ops.radixcluster.kernel_isa()
    torch.ops.radixcluster.use_isa(name)
    try:
        yield name
    finally:
        torch.ops.radixcluster.use_isa(default)


def case(name: str, page_size: int, heads: tuple[int, int], dtype: torch.dtype, seed: int = 0) -> Case:
    lens, groups = BATCHES[name]
    return Case(lens, page_size, *heads, seed=seed, head_dim=HEAD_DIM, dtype=dtype, groups=groups)


def run_native(c: Case) -> torch.Tensor:
    return c.run(native_store_kv, native_paged_attention, gather_rows=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"gqa{h[0] // h[1]}")
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(BATCHES))
def test_matches_dense_attention(
    isa: str, name: str, page_size: int, heads: tuple[int, int], dtype: torch.dtype
) -> None:
    c = case(name, page_size, heads, dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(run_native(c).float(), c.expected().float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["decodes", "mixed", "shared-decodes", "shared-extends", "long-prefill-many-tiles"])
def test_an_fp8_cache_matches_dense_attention_over_its_values(
    isa: str, name: str, dtype: torch.dtype, cache_dtype: torch.dtype
) -> None:
    # the rows staged as the activations' dtype for every path: fp32 tiles, bf16 dot products
    # (a decode's 3 rows), AMX tiles (a group's 12 rows, prefills)
    c = case(name, 16, (9, 3), dtype).with_cache_dtype(cache_dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(run_native(c).float(), c.expected().float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("heads", [(9, 3), (8, 1)], ids=["3-rows", "8-rows"])
def test_every_fp8_value_is_read_back_exactly(isa: str, dtype: torch.dtype, cache_dtype: torch.dtype, heads) -> None:
    # one key per request: its softmax weight is 1, so each output row is the V row the cache
    # holds, whichever path reads it (3 query rows: dot products; 8: AMX tiles where present)
    codes = torch.arange(256, dtype=torch.uint8).view(cache_dtype).float()
    values = codes[codes.isfinite()]  # every finite fp8 value, subnormals and zeros included
    kv_heads, group = heads[1], heads[0] // heads[1]
    rows = -(-len(values) // (kv_heads * HEAD_DIM))
    v = torch.cat([values, torch.zeros(rows * kv_heads * HEAD_DIM - len(values))]).view(rows, kv_heads, HEAD_DIM)
    c = Case([(0, 1)] * rows, 16, *heads, head_dim=HEAD_DIM, dtype=dtype)
    c.v = [v[b : b + 1].to(dtype) for b in range(rows)]
    out = run_native(c.with_cache_dtype(cache_dtype))
    assert torch.equal(out.float(), v.repeat_interleave(group, dim=1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 48, 96, 128])
@pytest.mark.parametrize("name", ["decodes", "shared-extends", "long-prefill-many-tiles"])
def test_other_head_dims_match_dense_attention(isa: str, name: str, head_dim: int, dtype: torch.dtype) -> None:
    # head_dims beside SmolLM2's 64: the tiles step through head_dim a vector at a time, and
    # bf16 dot products want a multiple of 32 (48 takes the widening path instead)
    lens, groups = BATCHES[name]
    c = Case(lens, 1, 9, 3, head_dim=head_dim, dtype=dtype, groups=groups)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(run_native(c).float(), c.expected().float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_instruction_sets_agree(dtype: torch.dtype) -> None:
    results = {}
    for name in torch.ops.radixcluster.supported_isas():
        for _ in forced_isa(name):
            results[name] = run_native(case("shared-extends", 1, (9, 3), dtype)).float()
    assert "scalar" in results and (len(results) >= 2 or native.load() == "scalar")
    for out in results.values():
        torch.testing.assert_close(out, results["scalar"], rtol=1e-5, atol=TOLERANCE[dtype] / 2)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", ["mixed", "shared-decodes"])
def test_corrupted_page_table_changes_the_result(name: str, page_size: int) -> None:
    c = case(name, page_size, (9, 3), torch.float32)
    expected = c.expected()
    spare = next(page for page in range(c.k_cache.shape[0]) if page not in c.page_table)
    c.page_table[:, 0] = spare  # a page of noise instead of each request's first page
    assert not torch.allclose(run_native(c), expected, rtol=1e-3, atol=1e-3)


def test_a_group_prefix_is_one_task_for_all_its_members() -> None:
    c = case("two-groups-and-a-loner", 1, (9, 3), torch.float32)
    plan = native_plan(c.metadata(gather_rows=False), 9, 3, HEAD_DIM, c.k_cache.shape[0])
    tasks, segments = plan.tasks.tolist(), plan.segments.tolist()
    requests = [sorted(segments[s][0] for s in range(t[3], t[4])) for t in tasks]
    shared = {tuple(r): (t[1], t[2]) for t, r in zip(tasks, requests) if t[1] == 0 and len(r) > 1}
    assert shared == {(0, 1): (0, 32), (2, 3): (0, 48)}
    own = {r[0]: (t[1], t[2]) for t, r in zip(tasks, requests) if len(r) == 1}
    assert own == {0: (32, 33), 1: (32, 41), 2: (48, 49), 3: (48, 51), 4: (0, 21)}
    # the loner's task writes its output; every grouped token is merged from its two parts
    assert [t[6] for t, r in zip(tasks, requests) if r == [4]] == [-1]
    assert sorted(m[0] for m in plan.merges.tolist()) == [0, 1, 2, 3]


def test_a_claimed_prefix_is_checked_against_the_page_tables() -> None:
    c = case("shared-decodes", 1, (9, 3), torch.float32)
    expected = c.expected()
    # request 2's table leaves the group's pages at token 20, its K/V copied along
    spare = [p for p in range(c.k_cache.shape[0]) if p not in c.page_table][:12]
    for t, page in zip(range(20, 32), spare):
        c.k_cache[page], c.v_cache[page] = c.k_cache[c.page_table[2, t]], c.v_cache[c.page_table[2, t]]
        c.page_table[2, t] = page
    plan = native_plan(c.metadata(gather_rows=False), 9, 3, HEAD_DIM, c.k_cache.shape[0])
    assert {(t[1], t[2]) for t in plan.tasks.tolist() if t[1] == 0 and t[4] - t[3] > 1} == {(0, 20)}
    torch.testing.assert_close(run_native(c), expected, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("heads", [(8, 1), (9, 3)], ids=["1-kv-head", "3-kv-heads"])
def test_long_context_is_split_across_threads(heads: tuple[int, int]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        c = Case([(1500, 1)], 1, *heads, head_dim=HEAD_DIM, dtype=torch.float32)
        plan = native_plan(c.metadata(gather_rows=False), *heads, HEAD_DIM, c.k_cache.shape[0])
        # a task runs all its KV heads on one thread, so however many there are, 4 threads want
        # 16 tasks: 1,501 keys make 5 of at least 256 keys
        assert len(plan.tasks) == 5 and len(plan.merges) == 1
        torch.testing.assert_close(run_native(c), c.expected(), rtol=2e-5, atol=2e-5)
    finally:
        torch.set_num_threads(threads)


def test_a_page_outside_the_cache_is_refused() -> None:
    c = case("decodes", 16, (4, 4), torch.float32)
    c.page_table[1, 0] = c.k_cache.shape[0]
    with pytest.raises(ValueError, match="page .* is outside the cache"):
        native_plan(c.metadata(gather_rows=False), 4, 4, HEAD_DIM, c.k_cache.shape[0])


@settings(max_examples=30, deadline=None)
@given(
    lens=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), min_size=1, max_size=6),
    page_size=st.sampled_from([1, 4, 16]),
    share=st.integers(0, 60),
    seed=st.integers(0, 2**16),
)
def test_any_batch_and_grouping_matches_dense_attention(
    lens: list[tuple[int, int]], page_size: int, share: int, seed: int
) -> None:
    # the requests whose prefix covers `share` tokens (rounded to pages) share them
    shared = share // page_size * page_size
    members = [b for b, (prefix, _) in enumerate(lens) if prefix >= shared]
    groups = [(members, shared)] if shared and len(members) > 1 else []
    c = Case(lens, page_size, 6, 2, seed, head_dim=HEAD_DIM, dtype=torch.float32, groups=groups)
    torch.testing.assert_close(run_native(c), c.expected(), rtol=2e-5, atol=2e-5)


def test_group_arrays_reach_the_metadata_as_int32() -> None:
    meta = case("shared-decodes", 1, (4, 4), torch.float32).metadata(gather_rows=False)
    assert meta.shared_groups.dtype == torch.int32 and meta.shared_groups.tolist() == [0, 0, 0, 0]
    assert np.array_equal(meta.shared_lens.numpy(), [32])
