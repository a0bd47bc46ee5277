"""The native kernels' K/V store, fused layer steps and one-row linear product
(``torch.ops.radixcluster``; load them with ``native.load()`` first). Each matches its torch
reference in ``layer_ops``/``attention``."""

from __future__ import annotations

import torch

from radixcluster.kernels.attention import AttentionMetadata
from radixcluster.kernels.layer_ops import LayerOps
from radixcluster.kernels.native_attention import native_plan, plan_args


def native_store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """``attention.store_kv``: rows ``slot_mapping`` of the caches take ``k`` and ``v``."""
    torch.ops.radixcluster.store_kv(k_cache, v_cache, slot_mapping, k, v)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    torch.ops.radixcluster.rms_norm(x, weight, eps, out)
    return out


def _add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # in place: residual becomes residual + x, x its normalised rows
    torch.ops.radixcluster.add_rms_norm(x, residual, weight, eps)
    return x, residual


def _silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    out = x.new_empty(x.shape[0], x.shape[1] // 2)
    torch.ops.radixcluster.silu_and_mul(x, out)
    return out


def _rope_and_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    torch.ops.radixcluster.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads)
    head_dim = k_cache.shape[-1]
    return qkv[:, : num_heads * head_dim].view(qkv.shape[0], num_heads, head_dim)


def native_matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for a few rows ``x`` ``[m, k]``; summed in another order, so fp32
    results differ in the last bits."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    torch.ops.radixcluster.matvec(x.contiguous(), weight, out)
    return out


def native_decoder_layers(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    meta: AttentionMetadata,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``LayerOps.decoder_layers``: the layers' own kernels, in their order, in one call."""
    plan = native_plan(meta, num_heads, num_kv_heads, k_caches[0].shape[-1], k_caches[0].shape[0])
    residual = torch.empty_like(x)
    torch.ops.radixcluster.decoder_layers(
        x,
        residual,
        weights,
        cos,
        sin,
        k_caches,
        v_caches,
        meta.slot_mapping,
        *plan_args(meta, plan),
        num_heads,
        num_kv_heads,
        scale,
        eps,
    )
    return x, residual


# The most rows the native product serves, by the kernels' instruction set: where a whole decode
# step (SmolLM2, 2 threads) stops running faster through it, in one native call, than layer by layer
# on oneDNN's packed weights. The AVX2 EPYC (benchmarks/bench_few_rows.py, docs/BENCHMARKS.md
# "Decode steps of a few requests"): the step's linear work 1.84x faster at 1 row, 1.3-1.5x at 2-8,
# 1.26x at 16, 1.16x at 32, 1.12x at 64, and one call another 1.12x at 32. The AVX-512 EPYC (Zen 4,
# docs/BENCHMARKS.md "Few rows on an AVX-512 EPYC"), where oneDNN's product runs on AVX-512 too:
# the step 1.44x at 2 rows, 1.19x at 4, 1.10x at 8, 1.11x at 16, 0.96x at 32 (0.85x with AVX2's
# tile of 3 x 4 sums).
MATVEC_ROWS = {"avx512bf16": 16, "avx512": 16}
MATVEC_ROWS_ELSE = 32


def native_layer_ops(isa: str) -> LayerOps:
    """The fused steps, the few-row product and the layers in one call, on kernels of ``isa``."""
    return LayerOps(
        _rms_norm,
        _add_rms_norm,
        _silu_and_mul,
        _rope_and_store,
        native_matvec,
        native_decoder_layers,
        MATVEC_ROWS.get(isa, MATVEC_ROWS_ELSE),
    )
