"""The Triton kernels against the torch reference on float32 inputs: natively on a GPU, on
Triton's interpreter over CPU tensors otherwise (tests/kernels/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from support.paged_case import Case

triton = pytest.importorskip("triton")

from radixcluster.kernels.attention import store_kv  # noqa: E402
from radixcluster.kernels.triton_attention import decode_splits, triton_paged_attention  # noqa: E402
from radixcluster.kernels.triton_cascade import plan_cascade  # noqa: E402
from radixcluster.kernels.triton_kv_store import triton_store_kv  # noqa: E402

HEAD_DIM = 64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCHES = {
    "prefill-two-query-blocks": [(0, 70)],
    "prefix-inside-page": [(5, 9)],
    "prefix-on-page-boundary": [(16, 3), (64, 20)],
    "decodes-several-splits": [(300, 1), (3, 1), (0, 1), (140, 1)],
    "mixed": [(0, 9), (17, 1), (16, 12), (5, 1), (131, 2)],
}


# shared-prefix (cascade) decodes: (lengths, groups of (members, shared tokens))
SHARED = {
    "one-group": ([(32, 1), (40, 1), (33, 1), (50, 1)], [([0, 1, 2, 3], 32)]),
    "two-groups-and-a-loner": ([(32, 1), (40, 1), (48, 1), (50, 1), (20, 1)], [([0, 1], 32), ([2, 3], 48)]),
    "group-of-one": ([(32, 1), (40, 1)], [([1], 32)]),
    "extends-beside-a-group": ([(32, 5), (40, 1), (33, 20), (50, 1)], [([0, 1, 2, 3], 32)]),
    "many-members-several-tiles": ([(64, 1)] * 30, [(list(range(30)), 64)]),
}


def case(name: str, page_size: int, heads: int, kv_heads: int) -> Case:
    return Case(BATCHES[name], page_size, heads, kv_heads, head_dim=HEAD_DIM, dtype=torch.float32, device=DEVICE)


def shared_case(name: str, page_size: int, heads: int, kv_heads: int) -> Case:
    lens, groups = SHARED[name]
    return Case(lens, page_size, heads, kv_heads, head_dim=HEAD_DIM, dtype=torch.float32, device=DEVICE, groups=groups)


def run_triton(c: Case) -> torch.Tensor:
    return c.run(triton_store_kv, triton_paged_attention, gather_rows=False)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_matches_the_torch_reference(name: str, page_size: int, heads: int, kv_heads: int) -> None:
    expected = case(name, page_size, heads, kv_heads).run()
    torch.testing.assert_close(run_triton(case(name, page_size, heads, kv_heads)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(SHARED))
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4)])
def test_shared_prefix_decodes_match_the_reference(name: str, page_size: int, heads: int, kv_heads: int) -> None:
    c = shared_case(name, page_size, heads, kv_heads)
    torch.testing.assert_close(run_triton(c), c.expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("name", ["mixed", "decodes-several-splits", "shared:two-groups-and-a-loner"])
def test_an_fp8_cache_matches_the_reference(name: str, cache_dtype: torch.dtype) -> None:
    # the same fp8 rows read by both: the store's rounding (and saturation) and the reads
    def fp8_case() -> Case:
        c = shared_case(name.split(":")[1], 16, 9, 3) if ":" in name else case(name, 16, 9, 3)
        c = c.with_cache_dtype(cache_dtype)
        # a new token's K times 2**16, still on the fp8 grid: past e4m3's 448 and e5m2's 57,344,
        # saturated by both stores (the kernel clamps as the reference does; the interpreter's
        # conversion would saturate by itself). Values to round are left to the GPU (next test).
        c.k[0][-1] *= 2**16
        return c

    ours, ref = fp8_case(), fp8_case()
    torch.testing.assert_close(run_triton(ours), ref.run(), rtol=1e-5, atol=1e-5)
    assert torch.equal(ours.k_cache.view(torch.uint8), ref.k_cache.view(torch.uint8))
    assert torch.equal(ours.v_cache.view(torch.uint8), ref.v_cache.view(torch.uint8))


@pytest.mark.skipif(
    DEVICE != "cuda", reason="Triton's interpreter drops the carry of a rounding up to the next power of two"
)
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_the_fp8_store_rounds_as_torch_does(cache_dtype: torch.dtype) -> None:
    ours, ref = (case("mixed", 16, 9, 3).with_cache_dtype(cache_dtype) for _ in range(2))
    meta = ours.metadata(gather_rows=False)
    new_k, new_v = (x * 10 ** torch.empty_like(x).uniform_(-4, 4) for x in ours.new_kv())
    triton_store_kv(ours.k_cache, ours.v_cache, meta.slot_mapping, new_k, new_v)
    store_kv(ref.k_cache, ref.v_cache, meta.slot_mapping, new_k, new_v)
    assert torch.equal(ours.k_cache.view(torch.uint8), ref.k_cache.view(torch.uint8))
    assert torch.equal(ours.v_cache.view(torch.uint8), ref.v_cache.view(torch.uint8))


def test_a_group_reads_its_prefix_through_one_table_only() -> None:
    c = shared_case("one-group", 1, 9, 3)
    expected = c.expected()
    # the members' own copies of the shared page entries are never read: the cascade reads
    # the shared prefix through the first member's table, the split kernel starts past it
    spare = next(page for page in range(c.k_cache.shape[0]) if page not in c.page_table)
    c.page_table[1:, :32] = spare
    torch.testing.assert_close(run_triton(c), expected, rtol=1e-5, atol=1e-5)
    cascade = plan_cascade(c.metadata(gather_rows=False), 3)
    assert cascade.skip.tolist() == [32] * 4 and cascade.group_count.tolist() == [4]


def test_long_decodes_are_split() -> None:
    lens = BATCHES["decodes-several-splits"]
    assert decode_splits(max(p for p, _ in lens) + 1, len(lens), 3) > 1


@pytest.mark.parametrize("page_size", [1, 16])
def test_corrupted_page_table_changes_the_result(page_size: int) -> None:
    c = Case([(40, 3), (33, 1)], page_size, 9, 3, head_dim=HEAD_DIM, dtype=torch.float32, device=DEVICE)
    spare = next(page for page in range(c.k_cache.shape[0]) if page not in c.page_table)
    expected = c.expected()
    c.page_table[:, 0] = spare  # a page of noise instead of each request's first page
    assert not torch.allclose(run_triton(c), expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_store_writes_exactly_the_reference_rows(page_size: int) -> None:
    ours, ref = (case("mixed", page_size, 9, 3) for _ in range(2))
    meta = ours.metadata(gather_rows=False)
    new_k, new_v = ours.new_kv()
    # V as the QKV projection leaves it: a strided view of a wider row
    fused = torch.cat([new_k.flatten(1), new_v.flatten(1)], dim=1)
    strided_v = fused[:, new_k[0].numel() :].view_as(new_v)
    assert not strided_v.is_contiguous()
    triton_store_kv(ours.k_cache, ours.v_cache, meta.slot_mapping, new_k, strided_v)
    store_kv(ref.k_cache, ref.v_cache, meta.slot_mapping, new_k, new_v)
    assert torch.equal(ours.k_cache, ref.k_cache) and torch.equal(ours.v_cache, ref.v_cache)
