"""The Llama family (Llama 2/3, Mistral, SmolLM, Qwen2 with its QKV bias) over a paged KV
cache, tensor parallel; module names follow transformers' so checkpoint names map directly."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from radixcluster.kernels.attention import AttentionMetadata
from radixcluster.kernels.attention_backend import TORCH_BACKEND, AttentionBackend
from radixcluster.kernels.layer_ops import DecoderLayers, LayerOps
from radixcluster.kernels.rotary import rope_cos_sin, rope_inv_freq
from radixcluster.model_config import ModelConfig
from radixcluster.worker.kv_pool import KVPool
from radixcluster.worker.parallel import TPGroup
from radixcluster.worker.tp_layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    default_weight_loader,
)

# checkpoint projection -> (our merged module, its shard)
PACKED_MODULES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float, ops: LayerOps) -> None:
        super().__init__()
        self.eps = eps
        self.ops = ops
        self.weight = nn.Parameter(torch.empty(hidden), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalised input and the new residual stream (``x`` itself when none is given).
        With a residual, both inputs' storage may be reused for the results."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps), x
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, attention: AttentionBackend) -> None:
        super().__init__()
        self.attention = attention
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, config.head_dim, config.num_heads, config.num_kv_heads, config.qkv_bias, tp
        )
        self.num_heads, self.num_kv_heads = (n // config.head_dim for n in self.qkv_proj.local_sizes[:2])
        self.o_proj = RowParallelLinear(config.num_heads * config.head_dim, config.hidden_size, tp)
        self.scale = config.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        q = self.attention.layer_ops.rope_and_store(
            self.qkv_proj(x), cos, sin, k_cache, v_cache, meta.slot_mapping, self.num_heads, self.num_kv_heads
        )
        out = self.attention.paged_attention(q, k_cache, v_cache, meta, self.scale)
        return self.o_proj(out.view(x.shape[0], self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, ops: LayerOps) -> None:
        super().__init__()
        width = config.intermediate_size
        self.ops = ops
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [width, width], False, tp)
        self.down_proj = RowParallelLinear(width, config.hidden_size, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, attention: AttentionBackend) -> None:
        super().__init__()
        ops = attention.layer_ops
        self.self_attn = LlamaAttention(config, tp, attention)
        self.mlp = LlamaMLP(config, tp, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, cos, sin, meta, k_cache, v_cache)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, tp: TPGroup, attention: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp)
        layers = [LlamaDecoderLayer(config, tp, attention) for _ in range(config.num_layers)]
        self.layers = nn.ModuleList(layers)
        self.local_kv_heads = layers[0].self_attn.num_kv_heads  # this rank's (replicated past tp > heads)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, attention.layer_ops)
        # a plain attribute, not a buffer: it stays float32 when the model is cast
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)


class LlamaForCausalLM(nn.Module):
    """Create it under ``torch.device(...)``, cast with ``.to(dtype)``, then ``load_weights``.
    ``attention`` is the paged-attention implementation every layer calls, with its set of
    elementwise steps."""

    def __init__(self, config: ModelConfig, tp: TPGroup, attention: AttentionBackend = TORCH_BACKEND) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, tp, attention)
        tied = self.model.embed_tokens if config.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp, tied)
        self.tp = tp
        self._layer_weights: list[torch.Tensor] | None = None  # decoder_layers' weights, gathered once

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_pool: KVPool,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor | None:
        """Run the new tokens (``[T]`` ids and positions) through every layer, writing their
        K/V into ``kv_pool``; return the logits ``[len(logit_rows), vocab]`` of the chosen
        token rows on rank 0, None on other ranks."""
        m = self.model
        x = m.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, m.inv_freq, x.dtype)
        residual: torch.Tensor | None = None
        at_once = self._decoder_layers(x.shape[0])
        if at_once is None:
            for layer, k_cache, v_cache in zip(m.layers, kv_pool.k, kv_pool.v):
                x, residual = layer(x, residual, cos, sin, meta, k_cache, v_cache)
        else:
            attn = self._first_layer().self_attn
            heads = (attn.num_heads, attn.num_kv_heads)
            x, residual = at_once(
                x, self._weights(), cos, sin, kv_pool.k, kv_pool.v, meta, *heads, attn.scale, self.config.rms_norm_eps
            )
        assert residual is not None, "a model has layers"
        # only the rows whose logits are wanted need the final norm and the LM head
        x, _ = m.norm(x.index_select(0, logit_rows), residual.index_select(0, logit_rows))
        return self.lm_head(x)

    def _decoder_layers(self, rows: int) -> DecoderLayers | None:
        """The layers' one-call path for ``rows`` rows where it computes what they would one by
        one: one rank, no biases, and every linear product through the native few-row product."""
        first = self._first_layer()
        at_once = first.self_attn.attention.layer_ops.decoder_layers
        if at_once is None or self.tp.size > 1 or first.self_attn.qkv_proj.bias is not None:
            return None
        if rows > first.self_attn.attention.layer_ops.matvec_rows:
            return None
        for linear in _linears(first):
            if linear.fast is None or linear.fast.blocked is None or rows > linear.fast.matvec_rows:
                return None
        return at_once

    def _first_layer(self) -> LlamaDecoderLayer:
        return cast(LlamaDecoderLayer, self.model.layers[0])

    def _weights(self) -> list[torch.Tensor]:
        if self._layer_weights is None:
            self._layer_weights = []
            for layer in cast(Iterable[LlamaDecoderLayer], self.model.layers):
                qkv, o, gate_up, down = (_blocked(linear) for linear in _linears(layer))
                post_norm = layer.post_attention_layernorm.weight
                self._layer_weights += [layer.input_layernorm.weight, qkv, o, post_norm, gate_up, down]
        return self._layer_weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load full checkpoint tensors (transformers' names), each cut to this rank's shard
        by its parameter's loader; every parameter must be loaded exactly by the end."""
        params = dict(self.named_parameters())
        missing = {source for name in params for source in _checkpoint_names(name)}
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and self.config.tie_word_embeddings):
                continue
            target, shard = _parameter_name(name)
            param = params.get(target)
            if param is None:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter here")
            if shard is None:
                getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            else:
                param.weight_loader(param, tensor, shard)  # type: ignore[attr-defined]  # set by tp_layers
            missing.discard(name)
        if missing:
            raise ValueError(f"checkpoint lacks {sorted(missing)[:5]} ({len(missing)} parameters)")


def _parameter_name(name: str) -> tuple[str, int | None]:
    """Our parameter for a checkpoint tensor, and its shard when projections are merged."""
    module, _, kind = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    if leaf in PACKED_MODULES:
        merged, shard = PACKED_MODULES[leaf]
        return f"{parent}.{merged}.{kind}", shard
    return name, None


def _checkpoint_names(param_name: str) -> list[str]:
    """The checkpoint tensors that fill one of our parameters."""
    module, _, kind = param_name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    sources = [source for source, (merged, _) in PACKED_MODULES.items() if merged == leaf]
    return [f"{parent}.{source}.{kind}" for source in sources] or [param_name]


def _linears(layer: LlamaDecoderLayer) -> tuple[MergedColumnParallelLinear | RowParallelLinear, ...]:
    """A layer's four linear products, in the one-call path's order: qkv, o, gate_up, down."""
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _blocked(linear: MergedColumnParallelLinear | RowParallelLinear) -> torch.Tensor:
    """A linear layer's weight in the native product's layout (``_decoder_layers`` checked it has one)."""
    blocked = linear.fast.blocked if linear.fast is not None else None
    assert blocked is not None, "the one-call path runs only where every product has a blocked weight"
    return blocked
