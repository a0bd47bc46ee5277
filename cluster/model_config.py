"""A model's shape, read from a Hugging Face ``config.json`` or from GGUF metadata.

Both the router (context length, vocabulary, KV sizing) and the workers read it, so it
lives here and imports neither torch nor model code.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixcluster.gguf_file import GGUFFile, read_gguf
from radixcluster.model_path import ModelPathError

# Hugging Face architecture names and GGUF ``general.architecture`` values we run.
SUPPORTED_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
# each with the Hugging Face class its checkpoints convert from
SUPPORTED_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# the rotary scalings kernels/rotary.py computes ("default": none)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# transformers' names of the MLP's activation that are SiLU, the one the MLP computes
SILU_NAMES = ("silu", "swish")
# config.json fields without which the model's shape is unknown
_REQUIRED_HF_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The Llama-family shape. ``family`` is ``llama`` or ``qwen2`` (QKV bias);
    ``model_type`` and ``architectures`` are the checkpoint's own names, which SGLang's
    /model_info reports."""

    family: str
    model_type: str
    architectures: tuple[str, ...]
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    qkv_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # the keys a layer's attention sees when it slides (Mistral's sliding_window), which this
    # engine does not apply: up to that many tokens a sliding window sees everything full
    # attention sees, so the context stops there
    sliding_window: int | None = None

    @property
    def context_limit(self) -> int:
        """The longest sequence this engine computes as the model does."""
        return min(self.max_position_embeddings, self.sliding_window or self.max_position_embeddings)

    def kv_bytes_per_token(self, tp_size: int, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies on one rank (KV heads replicated when
        ``tp_size`` exceeds them)."""
        local_kv_heads = max(1, self.num_kv_heads // tp_size)
        return 2 * self.num_layers * local_kv_heads * self.head_dim * dtype_bytes

    def tp_size_problem(self, tp_size: int) -> str | None:
        """Why ``tp_size`` ranks cannot split this model, or None: each rank takes whole
        attention heads and an equal share of the MLP, and KV heads are split, or replicated
        evenly when there are fewer than ranks."""
        problems = self._tp_split_problems(tp_size)
        if not problems:
            return None
        fits = [n for n in range(1, self.num_heads + 1) if not self._tp_split_problems(n)]
        return f"{'; '.join(problems)} (sizes that fit: {', '.join(map(str, fits))})"

    def _tp_split_problems(self, tp_size: int) -> list[str]:
        kv_split = tp_size % self.num_kv_heads if tp_size > self.num_kv_heads else self.num_kv_heads % tp_size
        return [
            f"its {n} {what} do not split evenly over {tp_size} ranks"
            for n, what, rest in (
                (self.num_heads, "attention heads", self.num_heads % tp_size),
                (self.num_kv_heads, "KV heads", kv_split),
                (self.intermediate_size, "MLP channels", self.intermediate_size % tp_size),
            )
            if rest
        ]


def load_model_config(path: Path) -> ModelConfig:
    """Read the config of a resolved model path (a HF directory or a GGUF file); a
    ModelPathError for a model this engine would compute otherwise than it was trained."""
    cfg = _from_hf_dir(path) if path.is_dir() else _from_gguf(path)
    rope_type = _rope_type(cfg.rope_scaling or {})
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelPathError(
            f"{path}: unsupported rope scaling {rope_type!r} (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    return cfg


def _rope_type(rope: dict[str, Any]) -> str:
    """A rotary scaling's kind, under transformers' new name or its old one ("default": none)."""
    return rope.get("rope_type", rope.get("type", "default"))


def _eos_list(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _from_hf_dir(path: Path) -> ModelConfig:
    config_file = path / "config.json"
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelPathError(f"cannot read {config_file}: {exc}") from exc
    archs = cfg.get("architectures") or []
    family = next((SUPPORTED_HF_ARCHITECTURES[a] for a in archs if a in SUPPORTED_HF_ARCHITECTURES), None)
    if family is None:
        raise ModelPathError(
            f"{config_file}: unsupported architecture {archs or cfg.get('model_type')!r}; "
            f"supported: {sorted(SUPPORTED_HF_ARCHITECTURES)}"
        )
    missing = [name for name in _REQUIRED_HF_FIELDS if not isinstance(cfg.get(name), int)]
    if missing:
        raise ModelPathError(f"{config_file} lacks {', '.join(missing)} (an integer each)")
    activation = cfg.get("hidden_act", "silu")
    if activation not in SILU_NAMES:
        raise ModelPathError(f"{config_file}: unsupported hidden_act {activation!r} (the MLP computes silu)")
    if cfg.get("mlp_bias"):
        raise ModelPathError(f"{config_file}: mlp_bias (biases on the MLP's projections) is not supported")
    eos = cfg.get("eos_token_id")
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id", eos)
    num_heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    rope_type = _rope_type(rope)
    return ModelConfig(
        family=family,
        model_type=cfg.get("model_type", family),
        architectures=tuple(archs),
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope_theta),
        rope_scaling=None if rope_type == "default" else {k: v for k, v in rope.items() if k != "rope_theta"},
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_list(eos),
        sliding_window=_sliding_window(cfg, family),
    )


def _sliding_window(cfg: dict[str, Any], family: str) -> int | None:
    """The window of a config whose layers slide: Mistral's ``sliding_window``; a ``layer_types``
    list names the sliding layers; else Qwen2's slide as transformers reads its config, only with
    ``use_sliding_window`` true, and only the layers from ``max_window_layers`` on (28 unsaid)."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or window <= 0 or cfg.get("use_sliding_window") is False:
        return None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        return window if "sliding_attention" in layer_types else None
    if family == "qwen2":
        slides = cfg.get("use_sliding_window") is True and cfg.get("max_window_layers", 28) < cfg["num_hidden_layers"]
        return window if slides else None
    return window


def open_gguf(path: Path) -> GGUFFile:
    """The GGUF file's metadata and tensor table (read once per file and process), or a
    ModelPathError naming the file."""
    try:
        return read_gguf(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelPathError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def _from_gguf(path: Path) -> ModelConfig:
    gguf = open_gguf(path)
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelPathError(
            f"{path}: unsupported GGUF architecture {arch!r}; supported: {sorted(SUPPORTED_GGUF_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelPathError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(get("embedding_length"))
    num_heads = int(get("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else get("vocab_size")
    scaling_type = meta.get(f"{arch}.rope.scaling.type")
    rope_scaling = None
    if scaling_type not in (None, "none"):
        rope_scaling = {"rope_type": scaling_type, "factor": float(get("rope.scaling.factor", 1.0))}
    return ModelConfig(
        family=arch,
        model_type=arch,
        architectures=(SUPPORTED_GGUF_ARCHITECTURES[arch],),
        hidden_size=hidden,
        num_layers=int(get("block_count")),
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=int(meta.get(f"{arch}.rope.dimension_count", hidden // num_heads)),
        intermediate_size=int(get("feed_forward_length")),
        vocab_size=int(vocab),
        max_position_embeddings=int(get("context_length")),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings=not any(t.name == "output.weight" for t in gguf.tensors),
        qkv_bias=arch == "qwen2",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=_eos_list(meta.get("tokenizer.ggml.eos_token_id")),
    )
