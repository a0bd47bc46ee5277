"""Tensor parallelism with real processes over gloo: tp 2 and 4 on tiny random Llama and Qwen2
models (one with fewer KV heads than ranks, vocabularies that do not divide evenly) and tp 3
on SmolLM2 give the tp-1 logits."""

from __future__ import annotations

import pytest
import torch

from radixcluster.worker.model_runner import ModelRunner
from support.tp_ranks import run_steps, run_tp, runner_config, steps

TINY = dict(
    vocab_size=250,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    initializer_range=0.1,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# name -> (architecture, extra config)
TINY_MODELS = {
    "llama-2kv-untied-llama3rope": (
        "llama",
        dict(num_key_value_heads=2, tie_word_embeddings=False, rope_parameters=LLAMA3_ROPE),
    ),
    "qwen2-4kv-tied-bias": ("qwen2", dict(num_key_value_heads=4, tie_word_embeddings=True)),
}


def assert_close_rel(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape
        assert float((a - b).norm() / b.norm()) < 1e-4


@pytest.fixture(scope="module", params=sorted(TINY_MODELS))
def tiny_model(request, tmp_path_factory):
    """A random tiny model saved as a Hugging Face directory, and transformers' copy."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    family, extra = TINY_MODELS[request.param]
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if family == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY, **extra)).eval()
    for name, param in model.named_parameters():
        if name.endswith(("bias", "norm.weight")):
            param.data.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.5)  # HF inits these to constants
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return directory, model


@pytest.fixture(scope="module")
def tiny_tp1(tiny_model) -> list[torch.Tensor]:
    with torch.inference_mode():
        return run_steps(ModelRunner(runner_config(tiny_model[0])))


def test_tiny_tp1_matches_transformers(tiny_model, tiny_tp1) -> None:
    _, model = tiny_model
    vocab = model.config.vocab_size
    sequences = {}
    for batch, logits in zip(steps(vocab), tiny_tp1):
        for req, row in zip(batch, logits):
            sequences[req.slot] = sequences.get(req.slot, []) + req.token_ids
            with torch.inference_mode():
                ref = model(torch.tensor([sequences[req.slot]])).logits[0, -1]
            assert float((row - ref).norm() / ref.norm()) < 1e-4


@pytest.mark.parametrize("size", [2, 4])
def test_tiny_tp_matches_tp1(tiny_model, tiny_tp1, size, tmp_path) -> None:
    assert_close_rel(run_tp(tiny_model[0], size, tmp_path), tiny_tp1)


def test_smollm2_tp3_matches_tp1(model_path, tmp_path) -> None:
    with torch.inference_mode():
        tp1 = run_steps(ModelRunner(runner_config(model_path)))
    assert_close_rel(run_tp(model_path, 3, tmp_path), tp1)
