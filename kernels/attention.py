"""Paged attention over a mixed extend + decode batch: the torch reference path.

The KV cache of one layer is ``[num_pages, page_size, num_kv_heads, head_dim]``; token ``t``
of a request lives at row ``page_table[t // page_size] * page_size + t % page_size`` of its
flattened view. Per-step layout is computed once (``build_attention_metadata``) and shared by
every layer, so a Triton kernel can replace ``paged_attention`` with the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# the 8-bit KV cache formats (--kv-cache-dtype fp8_e4m3, fp8_e5m2): attention reads them as the
# activations' dtype
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(slots=True)
class ExtendSpan:
    """One request computing more than one new token: its query rows and its whole context."""

    q_start: int
    q_len: int
    prefix_len: int
    context_slots: torch.Tensor  # int64 [prefix_len + q_len]: cache rows of tokens 0..end


@dataclass(slots=True)
class GatheredRows:
    """The torch path's view of a step: every context token's cache row, gathered up front.

    Decodes (one new token) are batched: their contexts are padded to the longest and
    masked. Extends run one request at a time with a causal-with-offset mask.
    """

    decode_slots: torch.Tensor  # int64 [Bd, Lmax]: cache rows of each decode's context, padded with 0
    decode_mask: torch.Tensor  # bool [Bd, 1, 1, Lmax]: True where the context is real
    extends: list[ExtendSpan]


@dataclass(slots=True)
class AttentionMetadata:
    """Where every new token's K/V goes and what every query reads, for one step.

    The flat per-request tensors are what the Triton kernels read (they look pages up
    themselves); ``gathered`` is what the torch path reads, None when built without it.
    """

    slot_mapping: torch.Tensor  # int64 [T]: cache row of each new token
    decode_rows: torch.Tensor  # int64 [Bd]: query row of each decode request
    page_size: int
    page_table: torch.Tensor  # int32 [B, max_pages]: each request's pages
    q_starts: torch.Tensor  # int32 [B]: first query row of each request
    prefix_lens: torch.Tensor  # int32 [B]: tokens already cached
    extend_lens: torch.Tensor  # int32 [B]: new tokens
    decode_ids: torch.Tensor  # int32 [Bd]: requests with one new token
    extend_ids: torch.Tensor  # int32 [Be]: requests with more than one
    max_extend_len: int  # longest extend (0 when none)
    max_decode_context: int  # longest decode context, its new token included (0 when none)
    gathered: GatheredRows | None
    # requests sharing a cached prefix: each request's group (-1: none), int32 [B], and the
    # tokens each group's requests share on the same pages, int32 [G]; None when none share
    shared_groups: torch.Tensor | None = None
    shared_lens: torch.Tensor | None = None
    # a backend's per-step work, built by the first layer and reused by the others
    plan: object | None = None


def build_attention_metadata(
    page_table: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    page_size: int,
    device: torch.device | str = "cpu",
    *,
    gather_rows: bool = True,
    shared_groups: np.ndarray | None = None,
    shared_lens: np.ndarray | None = None,
) -> AttentionMetadata:
    """Layout of one step from each request's page-table row (int32 ``[B, max_pages]``, on the
    CPU) and its cached/new token counts (int ``[B]``); tensors land on ``device``.
    ``gather_rows=False`` skips the torch path's ``[B, max_context]`` row gather, which the
    Triton and native kernels do not need. ``shared_groups``/``shared_lens`` say which
    requests share a cached prefix (``protocol.ForwardBatch.prefix_groups``): the reference
    ignores them, the kernels that read a shared prefix once per group use them."""
    # numpy: per-request arrays are tiny, and torch's per-op overhead would dominate
    prefix = prefix_lens.numpy().astype(np.int64)
    new = extend_lens.numpy().astype(np.int64)
    context = prefix + new
    q_starts = np.cumsum(new) - new
    decode = np.flatnonzero(new == 1)
    extend = np.flatnonzero(new > 1)
    # new token i of request b sits at position i + prefix_len[b] - q_start[b]
    owner = np.repeat(np.arange(len(new)), new)
    t = np.arange(len(owner)) + (prefix - q_starts)[owner]
    slot_mapping = page_table.numpy()[owner, t // page_size].astype(np.int64) * page_size + t % page_size
    max_decode_context = int(context[decode].max(initial=0))

    def on_device(x: np.ndarray, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.from_numpy(x).to(device=device, dtype=dtype)

    return AttentionMetadata(
        slot_mapping=on_device(slot_mapping, torch.int64),
        decode_rows=on_device(q_starts[decode], torch.int64),
        page_size=page_size,
        # only the columns this step reaches: rows are as wide as the longest allowed context
        page_table=page_table[:, : -(-int(context.max()) // page_size)].to(device=device, dtype=torch.int32),
        q_starts=on_device(q_starts),
        prefix_lens=on_device(prefix),
        extend_lens=on_device(new),
        decode_ids=on_device(decode),
        extend_ids=on_device(extend),
        max_extend_len=int(new[extend].max(initial=0)),
        max_decode_context=max_decode_context,
        gathered=(
            _gather_rows(page_table, prefix, context, q_starts, decode, max_decode_context, extend, page_size, device)
            if gather_rows
            else None
        ),
        # copies: arrays decoded from a frame are read-only views of it
        shared_groups=None if shared_groups is None else torch.tensor(shared_groups, dtype=torch.int32, device=device),
        shared_lens=None if shared_lens is None else torch.tensor(shared_lens, dtype=torch.int32, device=device),
    )


def _gather_rows(
    page_table: torch.Tensor,
    prefix_lens: np.ndarray,
    context_lens: np.ndarray,
    q_starts: np.ndarray,
    decode: np.ndarray,
    dec_width: int,
    extend: np.ndarray,
    page_size: int,
    device: torch.device | str,
) -> GatheredRows:
    lens, dec = torch.from_numpy(context_lens), torch.from_numpy(decode)
    t = torch.arange(int(lens.max()))
    # cache row of token t of every request, valid where t < its context length
    rows = page_table[:, t // page_size].to(torch.int64) * page_size + t % page_size
    dec_mask = t[:dec_width] < lens[dec, None]
    extends = [
        ExtendSpan(
            q_start=int(q_starts[b]),
            q_len=int(lens[b] - prefix_lens[b]),
            prefix_len=int(prefix_lens[b]),
            context_slots=rows[b, : int(lens[b])].to(device),
        )
        for b in extend.tolist()
    ]
    return GatheredRows(
        decode_slots=rows[dec, :dec_width].masked_fill(~dec_mask, 0).to(device),
        decode_mask=dec_mask[:, None, None, :].to(device),
        extends=extends,
    )


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write the new tokens' K and V (``[T, num_kv_heads, head_dim]``) into their cache rows: in
    the cache's dtype, an fp8 one saturating at its largest value (``--kv-cache-dtype``)."""
    for cache, x in ((k_cache, k), (v_cache, v)):
        kv_heads, head_dim = cache.shape[-2:]
        if cache.dtype in FP8_DTYPES:
            limit = torch.finfo(cache.dtype).max
            # index_copy_ has no fp8 kernel on the CPU: copy the bytes
            rows = x.float().clamp(-limit, limit).to(cache.dtype).view(torch.uint8)
            cache.view(torch.uint8).view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, rows)
        else:
            cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, x.to(cache.dtype))


def paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """Attention of every new token (``q``: ``[T, num_heads, head_dim]``) over its request's
    cached prefix and, causally, its new tokens, whose K/V ``store_kv`` already wrote.

    ``num_heads`` is a multiple of the cache's ``num_kv_heads`` (grouped-query attention).
    Returns ``[T, num_heads, head_dim]``.
    """
    rows = meta.gathered
    if rows is None:
        raise ValueError("the torch attention path needs metadata built with gather_rows=True")
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_cache.shape[-2]
    k_flat = k_cache.view(-1, kv_heads, head_dim)
    v_flat = v_cache.view(-1, kv_heads, head_dim)
    if not rows.extends:
        return _decode_attention(q, k_flat, v_flat, meta.decode_rows, rows, scale)
    out = torch.empty_like(q)
    for span in rows.extends:
        out[span.q_start : span.q_start + span.q_len] = _extend_attention(q, k_flat, v_flat, span, scale)
    if len(meta.decode_rows):
        out.index_copy_(0, meta.decode_rows, _decode_attention(q, k_flat, v_flat, meta.decode_rows, rows, scale))
    return out


def _extend_attention(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, span: ExtendSpan, scale: float
) -> torch.Tensor:
    # 4-D inputs keep SDPA on its fused CPU kernel; enable_gqa avoids repeating K/V
    q_r = q[span.q_start : span.q_start + span.q_len].transpose(0, 1)[None]
    k = _gather_context(k_flat, span.context_slots[None], q.dtype)
    v = _gather_context(v_flat, span.context_slots[None], q.dtype)
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
    q: torch.Tensor,
    k_flat: torch.Tensor,
    v_flat: torch.Tensor,
    decode_rows: torch.Tensor,
    rows: GatheredRows,
    scale: float,
) -> torch.Tensor:
    num_heads, head_dim = q.shape[1:]
    kv_heads = k_flat.shape[1]
    batch = len(decode_rows)
    # the query heads sharing a KV head become that head's query rows: no K/V repeat
    q_d = q.index_select(0, decode_rows).view(batch, kv_heads, num_heads // kv_heads, head_dim)
    k = _gather_context(k_flat, rows.decode_slots, q.dtype)
    v = _gather_context(v_flat, rows.decode_slots, q.dtype)
    o = F.scaled_dot_product_attention(q_d, k, v, attn_mask=rows.decode_mask, scale=scale)
    return o.reshape(batch, num_heads, head_dim)


def _gather_context(flat: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows ``slots`` (``[B, L]``) as ``[B, num_kv_heads, L, head_dim]`` in ``dtype``."""
    batch, context = slots.shape
    # index_select, not advanced indexing: the latter is far slower for row gathers on CPU
    rows = flat.index_select(0, slots.flatten()).to(dtype)
    return rows.view(batch, context, *flat.shape[1:]).transpose(1, 2)
