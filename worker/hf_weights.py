"""Hugging Face safetensors weights: one file or shards listed in an index, memory-mapped
and read one tensor at a time, upcast to float32."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from radixcluster.model_path import ModelPathError, safetensors_files


def safetensors_loaders(directory: Path) -> dict[str, Callable[[], torch.Tensor]]:
    """A reader for every tensor in the directory's safetensors files, by name, shard by
    shard. Every shard is opened (headers checked, data memory-mapped) before this returns;
    no tensor data is read until a reader is called. Rotary ``inv_freq`` buffers, which
    some older checkpoints saved, are left out: they are derived from the config."""
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    for shard in safetensors_files(directory):
        handle = _open_shard(shard)
        for name in handle.keys():
            if not name.endswith("rotary_emb.inv_freq"):
                loaders[name] = functools.partial(_load, handle, name)
    return loaders


def _open_shard(shard: Path):
    try:
        return safe_open(shard, framework="pt")
    except (SafetensorError, OSError) as exc:
        raise ModelPathError(f"{shard} is not a readable safetensors file ({exc})") from exc


def _load(handle, name: str) -> torch.Tensor:
    tensor = handle.get_tensor(name)
    return tensor.float() if tensor.is_floating_point() else tensor
