"""Triton kernel that writes the new tokens' K and V into their paged-cache rows (the GPU
twin of ``attention.store_kv``): in the cache's dtype, an fp8 one saturating at its largest
value."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixcluster.kernels.attention import FP8_DTYPES


@triton.jit
def _store_kv_kernel(
    K, V, KCache, VCache, Slots, stride_k, stride_v, ROW: tl.constexpr, BLOCK: tl.constexpr, LIMIT: tl.constexpr
):
    token = tl.program_id(0)
    # int64: slot * ROW overflows int32 on pools past 2**31 elements
    slot = tl.load(Slots + token).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < ROW
    k = tl.load(K + token * stride_k + cols, mask=mask)
    v = tl.load(V + token * stride_v + cols, mask=mask)
    if LIMIT > 0:  # an fp8 cache
        k = tl.minimum(tl.maximum(k.to(tl.float32), -LIMIT), LIMIT)
        v = tl.minimum(tl.maximum(v.to(tl.float32), -LIMIT), LIMIT)
    tl.store(KCache + slot * ROW + cols, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(VCache + slot * ROW + cols, v.to(VCache.dtype.element_ty), mask=mask)


def triton_store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write ``k``/``v`` (``[T, num_kv_heads, head_dim]``, any token stride) into the rows
    ``slot_mapping`` of the contiguous caches."""
    tokens = len(slot_mapping)
    if tokens == 0:
        return
    k_rows, v_rows = _token_rows(k), _token_rows(v)
    row = k_rows.shape[1]
    _store_kv_kernel[(tokens,)](
        k_rows,
        v_rows,
        k_cache,
        v_cache,
        slot_mapping,
        k_rows.stride(0),
        v_rows.stride(0),
        ROW=row,
        BLOCK=triton.next_power_of_2(row),
        LIMIT=torch.finfo(k_cache.dtype).max if k_cache.dtype in FP8_DTYPES else 0.0,
    )


def _token_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[T, num_kv_heads * head_dim]`` with unit column stride: a view when each
    token's heads are contiguous (QKV split outputs are), a copy otherwise."""
    rows = x.reshape(len(x), -1)
    return rows if rows.stride(1) == 1 else rows.contiguous()
