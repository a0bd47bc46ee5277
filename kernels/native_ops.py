"""The native kernels' K/V store, fused layer steps and few-row linear product
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


def native_block_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` ``[n, k]`` in the native product's layout, shaped ``[n / B, k, B]`` (B output
    features side by side, the kernels' ``matvec_block``: their vector width; a bf16 weight's
    input features in pairs where the kernels have bf16 dot products), or None where B does not
    divide n."""
    if weight.shape[0] % int(torch.ops.radixcluster.matvec_block()):
        return None
    return torch.ops.radixcluster.block_weight(weight.detach())


def native_matvec(x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` for the rows ``x`` ``[m, k]``, ``blocked`` being
    ``native_block_weight(weight)``; summed in another order, so fp32 results differ in the
    last bits."""
    out = x.new_empty(x.shape[0], blocked.shape[0] * blocked.shape[2])
    torch.ops.radixcluster.matvec(x.contiguous(), blocked, out)
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


# Up to how many rows a step runs its layers in one native call (where every layer's product is
# the native one): the Python between the kernels costs ~0.1 ms a layer. On the AVX-512 EPYC
# (benchmarks/bench_forward.py --sections layers, the blocked product) one call was 1.17x faster
# at 1 row, 1.31x at 4 and 1.09x at 32 (fp32); on the AVX2 EPYC, with the row-major product of
# before, 1.12x at 32.
MATVEC_ROWS = 32


def native_layer_ops() -> LayerOps:
    """The fused steps, the few-row product and the layers in one call, on the loaded kernels."""
    return LayerOps(
        _rms_norm,
        _add_rms_norm,
        _silu_and_mul,
        _rope_and_store,
        native_matvec,
        native_block_weight,
        native_decoder_layers,
        MATVEC_ROWS,
    )
