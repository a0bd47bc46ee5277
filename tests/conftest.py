"""Shared fixtures: the embedded model, and Hugging Face transformers as the reference."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.servers import ServerHandle, launch_server

# Tests share 2 cores; torch's default of one thread per core is right, but never more.
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF file."""
    from radixcluster.model_path import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def hf_tokenizer(model_path: Path):
    """transformers' tokenizer read from the same GGUF: the reference for ours."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)


@pytest.fixture(scope="session")
def hf_model(model_path: Path):
    """transformers' float32 LlamaForCausalLM dequantized from the same GGUF: the reference
    for our logits (it is the reference, never the runtime loader)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path.parent, gguf_file=model_path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory: pytest.TempPathFactory, hf_model, hf_tokenizer) -> Path:
    """A Hugging Face directory converted from the embedded GGUF: float32 safetensors in
    100 MB shards with an index, config.json, generation_config.json, tokenizer.json and
    tokenizer_config.json (with the chat template)."""
    import copy

    from transformers import LlamaForCausalLM

    config = copy.deepcopy(hf_model.config)
    # The directory holds plain float32 safetensors: a GGUF quantization_config in its
    # config.json would misdescribe them.
    del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(hf_model.state_dict())
    directory = tmp_path_factory.mktemp("hf_model")
    model.save_pretrained(directory, max_shard_size="100MB")
    hf_tokenizer.save_pretrained(directory, save_jinja_files=False)
    return directory


@pytest.fixture(scope="session")
def server() -> Iterator[ServerHandle]:
    """One `radixcluster up` with default flags, shared by every test that needs nothing special."""
    with launch_server() as handle:
        yield handle
