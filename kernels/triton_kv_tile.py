"""The tile step every Triton attention kernel repeats over its context: a K or V tile of one
request and one KV head, looked up through its page table, and the running base-2 softmax it
folds into; and the normalised output and log2-sum-exp of a split."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kv_tile(
    Cache,
    PageTable,
    req,
    stride_pt,
    offs_n,
    n_mask,
    page_size,
    kv_head,
    stride_c,
    offs_d,
    d_mask,
    HEAD_DIM: tl.constexpr,
):
    """Context tokens ``offs_n`` of request ``req`` of one KV head, read through its page table."""
    page = tl.load(PageTable + req * stride_pt + offs_n // page_size, mask=n_mask, other=0)
    slot = page.to(tl.int64) * page_size + offs_n % page_size
    ptrs = Cache + slot[:, None] * stride_c + kv_head * HEAD_DIM + offs_d[None, :]
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def online_softmax_step(q, k, v, visible, m_i, l_i, acc, scale_log2, PRECISION: tl.constexpr):
    """The rows ``q`` attend to the tile's keys ``k`` and values ``v`` where ``visible`` (rows x
    keys): the running max ``m_i``, sum ``l_i`` and unnormalised output ``acc``, updated."""
    qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def split_result(m_i, l_i, acc):
    """A split's softmax-normalised output and its log2-sum-exp (-inf for a row that saw no key)."""
    nonempty = l_i > 0
    out = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    return out, lse
