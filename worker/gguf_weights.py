"""GGUF weights: dequantized with the ``gguf`` package, renamed from llama.cpp's names to
Hugging Face's, with llama.cpp's rotary row permutation of ``attn_q``/``attn_k`` undone."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from radixcluster.gguf_file import GGUFFile, GGUFTensor
from radixcluster.model_config import ModelConfig, open_gguf

logger = logging.getLogger(__name__)

_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, or None for one we do not use."""
    if match := _LAYER_TENSOR.fullmatch(gguf_name):
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}" if part in _LAYER_NAMES else None
    base, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[base]}.{kind}" if base in _GLOBAL_NAMES else None


def gguf_loaders(path: Path, config: ModelConfig) -> dict[str, Callable[[], torch.Tensor]]:
    """A reader for every tensor of the GGUF at ``path`` we use, by Hugging Face name, in
    file order. The file is memory-mapped; nothing is dequantized until a reader is called."""
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    gguf = open_gguf(path)
    for tensor in gguf.tensors:
        name = hf_name(tensor.name)
        if name is None:
            logger.debug("%s: skipping GGUF tensor %s", path, tensor.name)
            continue
        loaders[name] = functools.partial(_load, gguf, tensor, _permuted_heads(tensor.name, config))
    return loaders


def _permuted_heads(gguf_name: str, config: ModelConfig) -> int | None:
    """How many heads llama.cpp permuted this tensor's rows over, or None if it did not.

    llama.cpp's ``llama`` architecture applies rotary to adjacent pairs, so its converter
    interleaves each head's two rotary halves in ``attn_q``/``attn_k``; its ``qwen2``
    architecture rotates halves like Hugging Face does and leaves the rows alone.
    """
    if config.family != "llama":
        return None
    if ".attn_q." in gguf_name:
        return config.num_heads
    if ".attn_k." in gguf_name:
        return config.num_kv_heads
    return None


def _load(gguf: GGUFFile, tensor: GGUFTensor, permuted_heads: int | None) -> torch.Tensor:
    # dequantize already returns rows first ([out, in]), the reverse of GGUF's reported shape.
    weights = dequantize(gguf.tensor_data(tensor), GGMLQuantizationType(tensor.ggml_type))
    if permuted_heads is not None:
        weights = _unpermute_rotary(weights, permuted_heads)
    # F32 tensors come back as read-only views of the memory map; torch needs its own copy.
    return torch.from_numpy(np.require(weights, np.float32, ("C", "W")))


def _unpermute_rotary(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: per head, rows (pair, half) go back to (half, pair)."""
    rest = weights.shape[1:]
    head_half = weights.shape[0] // n_head // 2
    return weights.reshape(n_head, head_half, 2, *rest).swapaxes(1, 2).reshape(weights.shape)
