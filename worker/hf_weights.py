"""Hugging Face safetensors weights: one file or shards listed in an index, memory-mapped
and read one tensor at a time, upcast to float32."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from radixcluster.model_path import ModelPathError

INDEX_FILE = "model.safetensors.index.json"


def safetensors_loaders(directory: Path) -> dict[str, Callable[[], torch.Tensor]]:
    """A reader for every tensor in the directory's safetensors files, by name, shard by
    shard. Every shard is opened (headers checked, data memory-mapped) before this returns;
    no tensor data is read until a reader is called. Rotary ``inv_freq`` buffers, which
    some older checkpoints saved, are left out: they are derived from the config."""
    loaders: dict[str, Callable[[], torch.Tensor]] = {}
    for shard in _shard_files(directory):
        handle = _open_shard(shard)
        for name in handle.keys():
            if not name.endswith("rotary_emb.inv_freq"):
                loaders[name] = functools.partial(_load, handle, name)
    return loaders


def _shard_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if not index.is_file():
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise ModelPathError(
                f"{directory} holds no *.safetensors weights (PyTorch .bin checkpoints are not supported)"
            )
        return files
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelPathError(f"{index} is not a safetensors index ({type(exc).__name__}: {exc})") from exc
    files = [directory / name for name in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ModelPathError(f"{index} lists shard(s) that do not exist: {', '.join(missing)}")
    return files


def _open_shard(shard: Path):
    try:
        return safe_open(shard, framework="pt")
    except (SafetensorError, OSError) as exc:
        raise ModelPathError(f"{shard} is not a readable safetensors file ({exc})") from exc


def _load(handle, name: str) -> torch.Tensor:
    tensor = handle.get_tensor(name)
    return tensor.float() if tensor.is_floating_point() else tensor
