"""The native fused layer steps against the torch reference (layer_ops.torch_layer_ops) on every
instruction set this CPU runs: rotary + K/V store bit for bit, the K/V store exactly, RMSNorm,
SiLU·mul and the one-row linear product to the last bits (their sums and exponentials are
ordered differently)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from radixcluster.kernels import native
from radixcluster.kernels.attention import store_kv
from radixcluster.kernels.layer_ops import torch_layer_ops
from radixcluster.kernels.rotary import rope_cos_sin, rope_inv_freq

DTYPES = [torch.float32, torch.bfloat16]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
REFERENCE = torch_layer_ops(store_kv)
# fp32: a few ulps; bf16: one unit in the last place of the bf16 result
CLOSE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2**-7, "atol": 2**-7}}


@pytest.fixture(scope="module")
def ops():
    native.load()
    from radixcluster.kernels.native_ops import native_layer_ops

    return native_layer_ops()


@pytest.fixture(autouse=True, params=["amx", "avx512bf16", "avx512", "avx2", "scalar"])
def isa(ops, request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param not in torch.ops.radixcluster.supported_isas():
        pytest.skip(f"this CPU does not run {request.param}")
    default = torch.ops.radixcluster.kernel_isa()
    torch.ops.radixcluster.use_isa(request.param)
    yield request.param
    torch.ops.radixcluster.use_isa(default)


def bits(t: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor's bytes, to compare exactly (torch.equal has no fp8 kernel)."""
    return t.view(torch.uint8) if t.dtype in FP8 else t


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("cache_dtype", [None, *FP8], ids=["same", "e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 9, 3, 64), (37, 4, 2, 80), (300, 8, 8, 128)])
def test_rope_and_store_is_the_reference_bit_for_bit(
    ops, dtype, cache_dtype, tokens, heads, kv_heads, head_dim
) -> None:
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    positions = torch.randint(0, 100_000, (tokens,), generator=torch.Generator().manual_seed(1))
    cos, sin = rope_cos_sin(positions, rope_inv_freq(head_dim, 500000.0, None), dtype)
    slots = torch.randperm(2 * tokens, generator=torch.Generator().manual_seed(2))[:tokens]
    caches = {
        name: [torch.zeros(2 * tokens, 1, kv_heads, head_dim, dtype=cache_dtype or dtype) for _ in range(2)]
        for name in ("ours", "ref")
    }
    ours = ops.rope_and_store(qkv.clone(), cos, sin, *caches["ours"], slots, heads, kv_heads)
    ref = REFERENCE.rope_and_store(qkv.clone(), cos, sin, *caches["ref"], slots, heads, kv_heads)
    assert torch.equal(ours, ref)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(caches["ours"], caches["ref"]))


@pytest.mark.parametrize("cache_dtype", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_store_kv_into_an_fp8_cache_rounds_as_torch_does(ops, dtype, cache_dtype) -> None:
    from radixcluster.kernels.native_ops import native_store_kv

    # every magnitude: below the smallest subnormal, subnormals, normals, past the largest value
    scale = 10 ** torch.empty(40, 2, 64).uniform_(-5, 5.5, generator=torch.Generator().manual_seed(4))
    k, v = (randn(40, 2, 64, dtype=torch.float32, seed=seed) * scale for seed in (5, 6))
    # ties between two fp8 values, which round to the even one
    k[0, 0] = torch.arange(64) / 8 + 1 / 16
    k, v = k.to(dtype), v.to(dtype)
    slots = torch.randperm(48, generator=torch.Generator().manual_seed(7))[:40]
    ours, ref = ([torch.zeros(3, 16, 2, 64, dtype=cache_dtype) for _ in range(2)] for _ in range(2))
    native_store_kv(*ours, slots, k, v)
    store_kv(*ref, slots, k, v)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(ours, ref))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (33, 100), (700, 576)])
def test_rms_norm_matches_the_reference(ops, dtype, rows, hidden) -> None:
    x, weight = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype, seed=1)
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), REFERENCE.rms_norm(x, weight, 1e-5), **CLOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (33, 100), (700, 576)])
def test_add_rms_norm_updates_both_in_place(ops, dtype, rows, hidden) -> None:
    x, residual, weight = (
        randn(rows, hidden, dtype=dtype),
        randn(rows, hidden, dtype=dtype, seed=1),
        randn(hidden, dtype=dtype, seed=2),
    )
    normed, summed = REFERENCE.add_rms_norm(x, residual, weight, 1e-6)
    x_ours, residual_ours = x.clone(), residual.clone()
    got_normed, got_summed = ops.add_rms_norm(x_ours, residual_ours, weight, 1e-6)
    assert got_normed.data_ptr() == x_ours.data_ptr() and got_summed.data_ptr() == residual_ours.data_ptr()
    assert torch.equal(got_summed, summed)
    torch.testing.assert_close(got_normed, normed, **CLOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(("rows", "width"), [(1, 1536), (33, 100), (300, 1536)])
def test_silu_and_mul_matches_the_reference(ops, dtype, rows, width) -> None:
    x = randn(rows, 2 * width, dtype=dtype) * 4
    torch.testing.assert_close(ops.silu_and_mul(x), REFERENCE.silu_and_mul(x), **CLOSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_store_kv_writes_exactly_the_reference_rows(ops, dtype) -> None:
    from radixcluster.kernels.native_ops import native_store_kv

    k = randn(20, 3, 64, dtype=dtype)
    # V as the QKV projection leaves it: a strided view of a wider row
    v = randn(20, 6 * 64, dtype=dtype, seed=1)[:, 3 * 64 :].view(20, 3, 64)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:20]
    ours, ref = ([torch.zeros(4, 16, 3, 64, dtype=dtype) for _ in range(2)] for _ in range(2))
    native_store_kv(*ours, slots, k, v)
    store_kv(*ref, slots, k, v)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [
        (1, 16, 576),
        (1, 32, 37),
        (1, 96, 64),
        (1, 1536, 576),
        (1, 576, 1536),
        (2, 80, 40),
        (4, 96, 576),
        (7, 1536, 576),
        (8, 576, 1536),
        (13, 112, 37),
        (32, 960, 576),
        (70, 256, 64),
        (33, 80, 64),
        (9, 80, 64),
    ],
)
def test_matvec_is_f_linear_of_the_blocked_weight(ops, dtype, m, n, k) -> None:
    # blocks not a multiple of those streamed together (AVX-512: three), input rows not one of
    # the groups run against them (AVX-512: eight, else five), columns not one of the vector width
    x, weight = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, seed=1)
    blocked = ops.block_weight(weight)
    block = torch.ops.radixcluster.matvec_block()
    assert blocked.shape == (n // block, k, block)
    out = ops.matvec(x, blocked)
    assert out.shape == (m, n) and out.dtype == dtype
    # fp32 sums of k products: compared at the error such sums may differ by
    close = CLOSE[dtype] if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5 * k**0.5}
    torch.testing.assert_close(out, F.linear(x.float(), weight.float()).to(dtype), **close)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m", [1, 6, 9])
def test_matvec_with_blocks_left_over_from_its_passes(ops, dtype, m) -> None:
    # five blocks: passes of three (AVX-512) or two leave two or one to the one-block path
    n, k = 5 * torch.ops.radixcluster.matvec_block(), 41
    x, weight = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, seed=2)
    close = CLOSE[dtype] if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5 * k**0.5}
    out = ops.matvec(x, ops.block_weight(weight))
    torch.testing.assert_close(out, F.linear(x.float(), weight.float()).to(dtype), **close)


def test_a_weight_whose_rows_do_not_fill_the_blocks_is_not_blocked(ops) -> None:
    block = torch.ops.radixcluster.matvec_block()
    assert ops.block_weight(torch.zeros(block + 1, 8)) is None


def test_bad_shapes_say_what_is_wrong(ops) -> None:
    with pytest.raises(RuntimeError, match="x must be contiguous rows of 8 values"):
        ops.matvec(torch.zeros(2, 7), ops.block_weight(torch.zeros(16, 8)))
    with pytest.raises(RuntimeError, match="weight must have the activations' dtype"):
        ops.matvec(torch.zeros(1, 8), ops.block_weight(torch.zeros(16, 8, dtype=torch.bfloat16)))
    with pytest.raises(RuntimeError, match="weight must be a contiguous blocked matrix"):
        torch.ops.radixcluster.matvec(torch.zeros(1, 8), torch.zeros(16, 8), torch.zeros(1, 16))
    with pytest.raises(RuntimeError, match="weight must be \\[hidden\\]"):
        ops.rms_norm(torch.zeros(2, 8), torch.zeros(7), 1e-5)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.silu_and_mul(torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="slot 99 is outside the cache"):
        cache = torch.zeros(2, 4, 1, 8)
        ops.rope_and_store(
            torch.zeros(1, 24), torch.zeros(1, 4), torch.zeros(1, 4), cache, cache.clone(), torch.tensor([99]), 1, 1
        )
