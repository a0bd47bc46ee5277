"""Triton paged attention (the GPU twin of ``attention.paged_attention``, same inputs): an
extend kernel for requests computing several new tokens, and a two-stage split-K decode whose
requests in a shared-prefix group read that prefix once per group (``triton_cascade``).

Both look pages up themselves from ``AttentionMetadata``'s flat per-request tensors, so the
torch path's gathered rows are not needed. Softmax runs in base 2 (``exp2``), with the
softmax scale folded into ``scale * log2(e)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixcluster.kernels.attention import AttentionMetadata
from radixcluster.kernels.triton_cascade import Cascade, plan_cascade, run_cascade
from radixcluster.kernels.triton_kv_tile import kv_tile, online_softmax_step, split_result

# Tensor-core tiles need every dot dimension >= 16; smaller ones are padded and masked.
MIN_DOT = 16
EXTEND_BLOCK_M = 64
BLOCK_N = 64
# Split-K decode: enough programs to fill a large GPU, never a split under MIN_SPLIT_TOKENS.
MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 64
TARGET_PROGRAMS = 1024


@triton.jit
def _extend_kernel(
    Q,
    KCache,
    VCache,
    Out,
    PageTable,
    QStarts,
    PrefixLens,
    ExtendLens,
    ExtendIds,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_c,
    scale_log2,
    page_size,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    req = tl.load(ExtendIds + tl.program_id(0))
    head = tl.program_id(1)
    block = tl.program_id(2)
    q_len = tl.load(ExtendLens + req)
    if block * BLOCK_M >= q_len:
        return
    q_start = tl.load(QStarts + req)
    prefix = tl.load(PrefixLens + req)
    kv_head = head // GROUP
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # the whole prefix, then the new tokens up to this block's last query (causal)
    end = prefix + tl.minimum(q_len, (block + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        k = kv_tile(
            KCache, PageTable, req, stride_pt, offs_n, n_mask, page_size, kv_head, stride_c, offs_d, d_mask, HEAD_DIM
        ).to(q.dtype)
        v = kv_tile(
            VCache, PageTable, req, stride_pt, offs_n, n_mask, page_size, kv_head, stride_c, offs_d, d_mask, HEAD_DIM
        ).to(q.dtype)
        # key 0 is visible to every row, so each row's max is finite after the first tile
        visible = (offs_n[None, :] <= prefix + offs_m[:, None]) & n_mask[None, :]
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale_log2, PRECISION)
    out_ptrs = Out + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


@triton.jit
def _decode_split_kernel(
    Q,
    KCache,
    VCache,
    PartOut,
    PartLse,
    PageTable,
    QStarts,
    PrefixLens,
    DecodeIds,
    DecodeSkip,
    stride_qt,
    stride_qh,
    stride_pt,
    stride_c,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    scale_log2,
    page_size,
    num_splits,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One split of one decode request's context past its first DecodeSkip[b] tokens (a shared
    prefix the cascade kernel covers), for the GROUP query heads of one KV head: the split's
    softmax-normalised output and its log2-sum-exp (-inf when the split is empty)."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    req = tl.load(DecodeIds + b)
    q_row = tl.load(QStarts + req)
    context = tl.load(PrefixLens + req) + 1
    skip = tl.load(DecodeSkip + b)
    split_len = tl.cdiv(context - skip, num_splits)
    start = skip + split * split_len
    end = tl.minimum(start + split_len, context)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q = tl.load(
        Q + q_row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        k = kv_tile(
            KCache, PageTable, req, stride_pt, offs_n, n_mask, page_size, kv_head, stride_c, offs_d, d_mask, HEAD_DIM
        ).to(q.dtype)
        v = kv_tile(
            VCache, PageTable, req, stride_pt, offs_n, n_mask, page_size, kv_head, stride_c, offs_d, d_mask, HEAD_DIM
        ).to(q.dtype)
        m_i, l_i, acc = online_softmax_step(q, k, v, n_mask[None, :], m_i, l_i, acc, scale_log2, PRECISION)
    out, lse = split_result(m_i, l_i, acc)
    tl.store(
        PartOut + b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :],
        out,
        mask=h_mask[:, None] & d_mask[None, :],
    )
    tl.store(PartLse + b * stride_lb + heads * stride_lh + split, lse, mask=h_mask)


@triton.jit
def _decode_reduce_kernel(
    PartOut,
    PartLse,
    Out,
    QStarts,
    DecodeIds,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_t,
    stride_h,
    num_splits,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge one request's and one head's splits, each weighted by its share of the softmax
    (a split with no keys, or a cascade slot the request has no part in, weighs nothing)."""
    b = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(PartLse + b * stride_lb + head * stride_lh + offs_s, mask=s_mask, other=float("-inf"))
    # split 0 is never empty (every context has at least one token past its skip), so the max is finite
    weight = tl.exp2(lse - tl.max(lse, 0))
    parts = tl.load(
        PartOut + b * stride_ob + head * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
        mask=(s_mask & (lse > float("-inf")))[:, None] & d_mask[None, :],
        other=0.0,
    )
    out = tl.sum(weight[:, None] * parts, 0) / tl.sum(weight, 0)
    q_row = tl.load(QStarts + tl.load(DecodeIds + b))
    tl.store(Out + q_row * stride_t + head * stride_h + offs_d, out.to(Out.dtype.element_ty), mask=d_mask)


def decode_splits(max_context: int, batch: int, kv_heads: int) -> int:
    """How many splits each decode context is cut into."""
    by_length = -(-max_context // MIN_SPLIT_TOKENS)
    by_occupancy = -(-TARGET_PROGRAMS // (batch * kv_heads))
    return max(1, min(MAX_SPLITS, by_length, by_occupancy))


def triton_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """``attention.paged_attention`` on Triton: same inputs (``meta`` may be built without
    gathered rows), same ``[T, num_heads, head_dim]`` result."""
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[-2]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the paged KV caches must be contiguous")
    shape = _Shape(
        num_heads // kv_heads,
        head_dim,
        max(MIN_DOT, triton.next_power_of_2(head_dim)),
        "ieee" if q.dtype == torch.float32 else None,
        scale * math.log2(math.e),
        kv_heads * head_dim,
    )
    out = torch.empty_like(q)
    if len(meta.extend_ids):
        _extend(q, k_cache, v_cache, out, meta, shape)
    if len(meta.decode_ids):
        _decode(q, k_cache, v_cache, out, meta, shape)
    return out


@dataclass(slots=True)
class _Shape:
    """What every kernel launch of one call shares."""

    group: int  # query heads per KV head
    head_dim: int
    block_d: int
    precision: str | None  # fp32 dots in full precision, not TF32; the default for 16-bit inputs
    scale_log2: float
    row: int  # elements per cache row: num_kv_heads * head_dim


def _extend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, meta: AttentionMetadata, s: _Shape
) -> None:
    grid = (len(meta.extend_ids), q.shape[1], triton.cdiv(meta.max_extend_len, EXTEND_BLOCK_M))
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        meta.page_table,
        meta.q_starts,
        meta.prefix_lens,
        meta.extend_lens,
        meta.extend_ids,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        meta.page_table.stride(0),
        s.row,
        s.scale_log2,
        meta.page_size,
        GROUP=s.group,
        HEAD_DIM=s.head_dim,
        BLOCK_M=EXTEND_BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=s.block_d,
        PRECISION=s.precision,
    )


def _decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor, meta: AttentionMetadata, s: _Shape
) -> None:
    batch, num_heads = len(meta.decode_ids), q.shape[1]
    kv_heads = num_heads // s.group
    splits = decode_splits(meta.max_decode_context, batch, kv_heads)
    cascade = meta.plan if isinstance(meta.plan, Cascade) else plan_cascade(meta, kv_heads)
    meta.plan = cascade
    slots = splits + (cascade.splits if cascade is not None else 0)
    part_out = torch.empty(batch, num_heads, slots, s.head_dim, dtype=torch.float32, device=q.device)
    # a cascade slot stays -inf (weightless) for a request outside every group
    part_lse = torch.full((batch, num_heads, slots), float("-inf"), dtype=torch.float32, device=q.device)
    part_strides = (*part_out.stride()[:3], *part_lse.stride()[:2])
    skip = cascade.skip if cascade is not None else torch.zeros(batch, dtype=torch.int32, device=q.device)
    _decode_split_kernel[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        part_out,
        part_lse,
        meta.page_table,
        meta.q_starts,
        meta.prefix_lens,
        meta.decode_ids,
        skip,
        q.stride(0),
        q.stride(1),
        meta.page_table.stride(0),
        s.row,
        *part_strides,
        s.scale_log2,
        meta.page_size,
        splits,
        GROUP=s.group,
        HEAD_DIM=s.head_dim,
        BLOCK_H=max(MIN_DOT, triton.next_power_of_2(s.group)),
        BLOCK_N=BLOCK_N,
        BLOCK_D=s.block_d,
        PRECISION=s.precision,
    )
    if cascade is not None:
        run_cascade(q, k_cache, v_cache, part_out, part_lse, meta, cascade, splits, s.group, s.scale_log2, s.precision)
    _decode_reduce_kernel[(batch, num_heads)](
        part_out,
        part_lse,
        out,
        meta.q_starts,
        meta.decode_ids,
        *part_strides,
        out.stride(0),
        out.stride(1),
        slots,
        HEAD_DIM=s.head_dim,
        BLOCK_S=triton.next_power_of_2(slots),
        BLOCK_D=s.block_d,
    )
