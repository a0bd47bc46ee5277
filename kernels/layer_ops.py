"""The steps of a decoder layer besides attention as one set: the elementwise ones (RMSNorm with
or without the residual add, rotary embedding followed by the K/V store, SiLU·mul) and a
linear layer's few-row product. ``torch_layer_ops`` is the reference composition (F.linear
does its products); ``native_ops.native_layer_ops`` fuses each step into one kernel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from radixcluster.kernels.activation import silu_and_mul
from radixcluster.kernels.attention import AttentionMetadata
from radixcluster.kernels.norm import add_rms_norm, rms_norm
from radixcluster.kernels.rotary import apply_rotary

StoreKV = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
# out [m, n] = x [m, k] @ weight [n, k]^T, the weight in the product's own layout (BlockWeight)
Matvec = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# a weight [n, k] in that layout, or None where the product cannot take it
BlockWeight = Callable[[torch.Tensor], torch.Tensor | None]
RopeAndStore = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor
]


class DecoderLayers(Protocol):
    """Every decoder layer of a step at once (see ``LayerOps``)."""

    def __call__(
        self,
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
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True, slots=True)
class LayerOps:
    """``add_rms_norm`` may reuse its inputs' storage for its results (the native one writes
    the normalised rows into ``x`` and the sum into ``residual``): callers pass tensors they own.

    ``rope_and_store(qkv, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads)``
    takes the fused projection output ``[T, (heads + 2 kv_heads) * head_dim]``, writes the
    rotated K and V into the caches' ``slot_mapping`` rows and returns the rotated q
    ``[T, heads, head_dim]`` (possibly a view of ``qkv``).

    ``matvec``: the native product linear layers use instead of ``F.linear`` (None: F.linear),
    on their weights laid out by ``block_weight`` (how many rows it serves is the worker's
    ``packed_linear.native_rows``); ``matvec_rows``: up to how many rows ``decoder_layers`` runs
    a step.

    ``decoder_layers(x, weights, cos, sin, k_caches, v_caches, meta, num_heads, num_kv_heads,
    scale, eps)``: every layer of the step in one call, for a model whose linear products all
    go through ``matvec`` (one rank, no biases), ``weights`` six a layer (input norm, qkv, o,
    post-attention norm, gate_up, down; the four products' as ``block_weight`` lays them out);
    returns what the layers one by one return, the last one's output and the residual stream
    (``x`` is overwritten). None: layer by layer."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    rope_and_store: RopeAndStore
    matvec: Matvec | None = None
    block_weight: BlockWeight | None = None
    decoder_layers: DecoderLayers | None = None
    matvec_rows: int = 0


def torch_layer_ops(store_kv: StoreKV) -> LayerOps:
    """The reference steps, writing K/V with ``store_kv``."""

    def rope_and_store(
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
    ) -> torch.Tensor:
        tokens, d = qkv.shape[0], k_cache.shape[-1]
        q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
        k = apply_rotary(k.view(tokens, num_kv_heads, d), cos, sin)
        store_kv(k_cache, v_cache, slot_mapping, k, v.view(tokens, num_kv_heads, d))
        return apply_rotary(q.view(tokens, num_heads, d), cos, sin)

    return LayerOps(rms_norm, add_rms_norm, silu_and_mul, rope_and_store)
