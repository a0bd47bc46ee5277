"""Weight loading: every tensor of a Llama-family model, by its Hugging Face name, as a full
float32 CPU tensor, one at a time, from a Hugging Face directory or a GGUF file."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from radixcluster.model_config import ModelConfig
from radixcluster.model_path import ModelPathError
from radixcluster.worker.gguf_weights import gguf_loaders
from radixcluster.worker.hf_weights import safetensors_loaders

logger = logging.getLogger(__name__)

# Hugging Face name -> a function that reads that tensor (float32, CPU) when called.
Loaders = dict[str, Callable[[], torch.Tensor]]


def iter_weights(path: Path, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every weight of the model at ``path``, in file order.

    Names are those of transformers' ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``
    ``state_dict``; ``lm_head.weight`` comes only when the embeddings are not tied. Each
    tensor is the full, unsharded float32 CPU tensor and is read only when its turn comes,
    so at most one is held here at a time.

    The file is opened and every required tensor checked to exist when this is called,
    before anything is yielded; each tensor's shape is checked against ``config`` as it is
    read. A bad path or file raises ``ModelPathError`` naming the path.
    """
    loaders = _open(path, config)
    if config.tie_word_embeddings:
        loaders.pop("lm_head.weight", None)
    shapes = expected_shapes(config)
    missing = [name for name in shapes if name not in loaders]
    if missing:
        shown = ", ".join(missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise ModelPathError(f"{path}: {len(missing)} required tensor(s) missing: {shown}")
    return _stream(path, loaders, shapes)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a model with ``config`` needs, by Hugging Face name."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_out = config.num_heads * config.head_dim
    kv_out = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for layer in range(config.num_layers):
        prefix = f"model.layers.{layer}."
        shapes |= {
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "self_attn.q_proj.weight": (q_out, hidden),
            prefix + "self_attn.k_proj.weight": (kv_out, hidden),
            prefix + "self_attn.v_proj.weight": (kv_out, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, q_out),
            prefix + "post_attention_layernorm.weight": (hidden,),
            prefix + "mlp.gate_proj.weight": (inter, hidden),
            prefix + "mlp.up_proj.weight": (inter, hidden),
            prefix + "mlp.down_proj.weight": (hidden, inter),
        }
        if config.qkv_bias:
            shapes |= {
                prefix + "self_attn.q_proj.bias": (q_out,),
                prefix + "self_attn.k_proj.bias": (kv_out,),
                prefix + "self_attn.v_proj.bias": (kv_out,),
            }
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def _open(path: Path, config: ModelConfig) -> Loaders:
    if path.is_dir():
        return safetensors_loaders(path)
    if path.is_file():
        return gguf_loaders(path, config)
    raise ModelPathError(f"model path {path} does not exist")


def _stream(path: Path, loaders: Loaders, shapes: dict[str, tuple[int, ...]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, load in tqdm(loaders.items(), desc="Loading weights", unit="tensor", leave=False):
        try:
            tensor = load()
        except Exception as exc:  # gguf and safetensors raise assorted bare errors on corrupt data
            raise ModelPathError(f"{path}: cannot read tensor {name} ({type(exc).__name__}: {exc})") from exc
        expected = shapes.get(name)
        if expected is not None and tuple(tensor.shape) != expected:
            raise ModelPathError(
                f"{path}: tensor {name} has shape {tuple(tensor.shape)}, the config implies {expected}"
            )
        if expected is None:
            logger.debug("%s: %s is beyond the Llama-family set; yielded with its shape unchecked", path, name)
        yield name, tensor
