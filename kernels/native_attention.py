"""Paged attention on the native CPU kernels: ``attention.paged_attention``'s inputs and result,
K/V read in place through the page table. The step's plan (tasks, their merges, a workspace)
is built by the first layer's call and reused by every other layer of the step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixcluster.kernels.attention import AttentionMetadata


@dataclass(slots=True)
class NativePlan:
    """``torch.ops.radixcluster.attention_plan``'s output for one step's shapes."""

    shape: tuple[int, int, int, int]  # query heads, KV heads, head_dim, cache pages: what it was built for
    tasks: torch.Tensor
    segments: torch.Tensor
    merges: torch.Tensor
    contribs: torch.Tensor
    partials: torch.Tensor


def native_plan(
    meta: AttentionMetadata, num_heads: int, num_kv_heads: int, head_dim: int, num_pages: int
) -> NativePlan:
    """The plan of ``meta``'s step for these shapes, built once and kept on ``meta``."""
    shape = (num_heads, num_kv_heads, head_dim, num_pages)
    plan = meta.plan
    if isinstance(plan, NativePlan) and plan.shape == shape:
        return plan
    tasks, segments, merges, contribs, partials = torch.ops.radixcluster.attention_plan(
        meta.q_starts,
        meta.prefix_lens,
        meta.extend_lens,
        meta.page_table,
        meta.page_size,
        num_pages,
        meta.shared_groups,
        meta.shared_lens,
        int(meta.slot_mapping.shape[0]),
        num_heads,
        num_kv_heads,
        head_dim,
    )
    meta.plan = NativePlan(shape, tasks, segments, merges, contribs, partials)
    return meta.plan


def plan_args(meta: AttentionMetadata, plan: NativePlan) -> tuple:
    """What the native attention operators take after their tensors: the page table, the
    requests' layout and the step's plan."""
    return (
        meta.page_table,
        meta.page_size,
        meta.q_starts,
        meta.prefix_lens,
        plan.tasks,
        plan.segments,
        plan.merges,
        plan.contribs,
        plan.partials,
    )


def native_paged_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """``attention.paged_attention`` on the native kernels (``meta`` may lack gathered rows)."""
    num_heads, head_dim = q.shape[1:]
    plan = native_plan(meta, num_heads, k_cache.shape[-2], head_dim, k_cache.shape[0])
    out = q.new_empty(q.shape)
    torch.ops.radixcluster.paged_attention(q, k_cache, v_cache, out, *plan_args(meta, plan), scale)
    return out
