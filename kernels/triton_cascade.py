"""Shared-prefix (cascade) decode on Triton: the decode requests of a group (``meta.shared_groups``)
attend to their shared prefix together, its K/V tiles loaded once per group for all members'
query heads (one dot instead of one per request). Each member gets the prefix's partial
output and log2-sum-exp in extra split slots; ``triton_attention``'s split-K decode covers the
rest of its context and its reduce merges both.

Everything is prepared on the device (no host sync): members are sorted by group, and each
program walks its group's members in tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from radixcluster.kernels.attention import AttentionMetadata
from radixcluster.kernels.triton_kv_tile import kv_tile, online_softmax_step, split_result

ROWS = 64  # query rows (members x query heads per KV head) per member tile
MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 64
TARGET_PROGRAMS = 1024


@dataclass(slots=True)
class Cascade:
    """Per decode request: where its own keys start (the shared length, 0 outside a group);
    per group: its decode members (indices into ``decode_ids``) and how many splits of the
    shared prefix every member gets."""

    skip: torch.Tensor  # int32 [Bd]
    order: torch.Tensor  # int32 [Bd]: decode indices sorted by group, ungrouped first
    group_start: torch.Tensor  # int32 [G]: a group's first member in ``order``
    group_count: torch.Tensor  # int32 [G]: its decode members
    lens: torch.Tensor  # int32 [G]
    splits: int


def plan_cascade(meta: AttentionMetadata, kv_heads: int) -> Cascade | None:
    """The cascade of the step's decodes, or None when no decode request is in a group."""
    if meta.shared_groups is None or meta.shared_lens is None or not len(meta.decode_ids):
        return None
    lens = meta.shared_lens
    groups = meta.shared_groups[meta.decode_ids.long()].long()
    num_groups = len(lens)
    counts = torch.bincount(groups + 1, minlength=num_groups + 1)
    starts = torch.cumsum(counts, 0) - counts
    skip = torch.where(groups >= 0, lens[groups.clamp(min=0)], 0)
    by_length = -(-meta.max_decode_context // MIN_SPLIT_TOKENS)
    by_occupancy = -(-TARGET_PROGRAMS // (num_groups * kv_heads))
    return Cascade(
        skip=skip.to(torch.int32),
        order=torch.argsort(groups, stable=True).to(torch.int32),
        group_start=starts[1:].to(torch.int32),
        group_count=counts[1:].to(torch.int32),
        lens=lens,
        splits=max(1, min(MAX_SPLITS, by_length, by_occupancy)),
    )


@triton.jit
def _cascade_kernel(
    Q,
    KCache,
    VCache,
    PartOut,
    PartLse,
    PageTable,
    QStarts,
    DecodeIds,
    Order,
    GroupStart,
    GroupCount,
    SharedLens,
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
    first_slot,
    num_splits,
    GROUP: tl.constexpr,
    MEMBERS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One split of group g's shared prefix, for every decode member's GROUP query heads of
    one KV head: each row's softmax-normalised partial output and log2-sum-exp."""
    g = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    count = tl.load(GroupCount + g)
    if count == 0:
        return
    first = tl.load(GroupStart + g)
    length = tl.load(SharedLens + g)
    split_len = tl.cdiv(length, num_splits)
    start = split * split_len
    end = tl.minimum(start + split_len, length)
    # the shared pages are the same in every member's table: read them through the first's
    key_req = tl.load(DecodeIds + tl.load(Order + first))
    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_r % GROUP
    for m0 in range(0, count, MEMBERS):
        member = m0 + offs_r // GROUP
        r_mask = (offs_r < MEMBERS * GROUP) & (member < count)
        b = tl.load(Order + first + member, mask=r_mask, other=0)
        q_row = tl.load(QStarts + tl.load(DecodeIds + b, mask=r_mask, other=0), mask=r_mask, other=0)
        q = tl.load(
            Q + q_row[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=r_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < end
            k = kv_tile(
                KCache,
                PageTable,
                key_req,
                stride_pt,
                offs_n,
                n_mask,
                page_size,
                kv_head,
                stride_c,
                offs_d,
                d_mask,
                HEAD_DIM,
            ).to(q.dtype)
            v = kv_tile(
                VCache,
                PageTable,
                key_req,
                stride_pt,
                offs_n,
                n_mask,
                page_size,
                kv_head,
                stride_c,
                offs_d,
                d_mask,
                HEAD_DIM,
            ).to(q.dtype)
            m_i, l_i, acc = online_softmax_step(q, k, v, n_mask[None, :], m_i, l_i, acc, scale_log2, PRECISION)
        out, lse = split_result(m_i, l_i, acc)
        slot = first_slot + split
        tl.store(
            PartOut + b[:, None] * stride_ob + heads[:, None] * stride_oh + slot * stride_os + offs_d[None, :],
            out,
            mask=r_mask[:, None] & d_mask[None, :],
        )
        tl.store(PartLse + b * stride_lb + heads * stride_lh + slot, lse, mask=r_mask)


def run_cascade(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    meta: AttentionMetadata,
    cascade: Cascade,
    first_slot: int,
    group: int,
    scale_log2: float,
    precision: str | None,
) -> None:
    """Fill split slots ``first_slot ..`` of every grouped decode with its shared prefix's part."""
    head_dim, kv_heads = q.shape[2], k_cache.shape[-2]
    members = max(1, ROWS // group)
    _cascade_kernel[(len(cascade.lens), kv_heads, cascade.splits)](
        q,
        k_cache,
        v_cache,
        part_out,
        part_lse,
        meta.page_table,
        meta.q_starts,
        meta.decode_ids,
        cascade.order,
        cascade.group_start,
        cascade.group_count,
        cascade.lens,
        q.stride(0),
        q.stride(1),
        meta.page_table.stride(0),
        kv_heads * head_dim,
        *part_out.stride()[:3],
        *part_lse.stride()[:2],
        scale_log2,
        meta.page_size,
        first_slot,
        cascade.splits,
        GROUP=group,
        MEMBERS=members,
        HEAD_DIM=head_dim,
        BLOCK_M=max(16, triton.next_power_of_2(members * group)),
        BLOCK_N=64,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION=precision,
    )
