"""The K or V tile every Triton attention kernel reads: context tokens of one request and one
KV head, looked up through its page table."""

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
