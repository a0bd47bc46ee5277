"""Paged attention over a mixed extend + decode batch: the torch reference path.

The KV cache of one layer is ``[num_pages, page_size, num_kv_heads, head_dim]``; token ``t``
of a request lives at row ``page_table[t // page_size] * page_size + t % page_size`` of its
flattened view. Per-step layout is computed once (``build_attention_metadata``) and shared by
every layer, so a Triton kernel can replace ``paged_attention`` with the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class ExtendSpan:
    """One request computing more than one new token: its query rows and its whole context."""

    q_start: int
    q_len: int
    prefix_len: int
    context_slots: torch.Tensor  # int64 [prefix_len + q_len]: cache rows of tokens 0..end


@dataclass(slots=True)
class AttentionMetadata:
    """Where every new token's K/V goes and what every query reads, for one step.

    Decodes (one new token) are batched: their contexts are padded to the longest and
    masked. Extends run one request at a time with a causal-with-offset mask.
    """

    slot_mapping: torch.Tensor  # int64 [T]: cache row of each new token
    decode_rows: torch.Tensor  # int64 [Bd]: query row of each decode request
    decode_slots: torch.Tensor  # int64 [Bd, Lmax]: cache rows of its context, padded with 0
    decode_mask: torch.Tensor  # bool [Bd, 1, 1, Lmax]: True where the context is real
    extends: list[ExtendSpan]


def build_attention_metadata(
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    page_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Layout of one step from each request's page-table row (int32 ``[B, max_pages]``, on the
    CPU) and its cached/new token counts (int ``[B]``); tensors land on ``device``."""
    prefix_lens = prefix_lens.to(torch.int64)
    extend_lens = extend_lens.to(torch.int64)
    context_lens = prefix_lens + extend_lens
    max_context = int(context_lens.max())
    t = torch.arange(max_context)
    # cache row of token t of every request, valid where t < its context length
    rows = page_table[:, t // page_size].to(torch.int64) * page_size + t % page_size
    is_new = (t >= prefix_lens[:, None]) & (t < context_lens[:, None])
    q_starts = torch.cumsum(extend_lens, 0) - extend_lens

    decode = (extend_lens == 1).nonzero().flatten()
    dec_width = int(context_lens[decode].max()) if len(decode) else 0
    dec_mask = t[:dec_width] < context_lens[decode, None]
    dec_slots = rows[decode, :dec_width].masked_fill(~dec_mask, 0)

    extends = [
        ExtendSpan(
            q_start=int(q_starts[b]),
            q_len=int(extend_lens[b]),
            prefix_len=int(prefix_lens[b]),
            context_slots=rows[b, : int(context_lens[b])].to(device),
        )
        for b in (extend_lens > 1).nonzero().flatten().tolist()
    ]
    return AttentionMetadata(
        slot_mapping=rows[is_new].to(device),
        decode_rows=q_starts[decode].to(device),
        decode_slots=dec_slots.to(device),
        decode_mask=dec_mask[:, None, None, :].to(device),
        extends=extends,
    )


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write the new tokens' K and V (``[T, num_kv_heads, head_dim]``) into their cache rows."""
    kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Attention of every new token (``q``: ``[T, num_heads, head_dim]``) over its request's
    cached prefix and, causally, its new tokens, whose K/V ``store_kv`` already wrote.

    ``num_heads`` is a multiple of the cache's ``num_kv_heads`` (grouped-query attention).
    Returns ``[T, num_heads, head_dim]``.
    """
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[-2]
    k_flat = k_cache.view(-1, kv_heads, head_dim)
    v_flat = v_cache.view(-1, kv_heads, head_dim)
    if not meta.extends:
        return _decode_attention(q, k_flat, v_flat, meta, scale)
    out = torch.empty_like(q)
    for span in meta.extends:
        out[span.q_start : span.q_start + span.q_len] = _extend_attention(q, k_flat, v_flat, span, scale)
    if len(meta.decode_rows):
        out.index_copy_(0, meta.decode_rows, _decode_attention(q, k_flat, v_flat, meta, scale))
    return out


def _extend_attention(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, span: ExtendSpan, scale: float
) -> torch.Tensor:
    # 4-D inputs keep SDPA on its fused CPU kernel; enable_gqa avoids repeating K/V
    q_r = q[span.q_start : span.q_start + span.q_len].transpose(0, 1)[None]
    k = _gather_context(k_flat, span.context_slots[None])
    v = _gather_context(v_flat, span.context_slots[None])
    if span.prefix_len == 0:
        o = F.scaled_dot_product_attention(q_r, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # query i sits at position prefix_len + i: is_causal would align it to key i instead
        ctx = torch.arange(k.shape[2], device=q.device)
        qpos = torch.arange(span.q_len, device=q.device) + span.prefix_len
        mask = ctx[None, :] <= qpos[:, None]
        o = F.scaled_dot_product_attention(q_r, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def _decode_attention(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_flat.shape[1]
    batch = len(meta.decode_rows)
    # the query heads sharing a KV head become that head's query rows: no K/V repeat
    q_d = q.index_select(0, meta.decode_rows).view(batch, kv_heads, num_heads // kv_heads, head_dim)
    k = _gather_context(k_flat, meta.decode_slots)
    v = _gather_context(v_flat, meta.decode_slots)
    o = F.scaled_dot_product_attention(q_d, k, v, attn_mask=meta.decode_mask, scale=scale)
    return o.reshape(batch, num_heads, head_dim)


def _gather_context(flat: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Cache rows ``slots`` (``[B, L]``) as ``[B, num_kv_heads, L, head_dim]``."""
    batch, context = slots.shape
    # index_select, not advanced indexing: the latter is far slower for row gathers on CPU
    rows = flat.index_select(0, slots.flatten())
    return rows.view(batch, context, *flat.shape[1:]).transpose(1, 2)
