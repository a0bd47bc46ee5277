"""Tensor parallelism with real processes over gloo: tp 2 and 4 on tiny random Llama and Qwen2
models (one with fewer KV heads than ranks, vocabularies that do not divide evenly) and tp 3
on SmolLM2 give the tp-1 logits."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from radixcluster.worker.parallel import init_tensor_parallel
from support.paged_batches import Extend, PageBook

PAGE_SIZE = 4
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
PROMPTS = [[5, 17, 99, 3, 140, 77, 8, 8, 201, 45, 12], [31, 2, 64, 9, 180], list(range(20, 39))]


def steps(vocab: int) -> list[list[Extend]]:
    """Two prefills; then two decodes beside a third prefill; then its chunked continuation."""
    p0, p1, p2 = ([t % vocab for t in p] for p in PROMPTS)
    return [
        [Extend(0, p0, 0), Extend(1, p1, 0)],
        [Extend(0, [7], len(p0)), Extend(2, p2[:9], 0), Extend(1, [11], len(p1))],
        [Extend(2, p2[9:], 9), Extend(1, [13], len(p1) + 1)],
    ]


def run_steps(runner: ModelRunner) -> list[torch.Tensor | None]:
    book = PageBook(PAGE_SIZE, runner.config.num_pages)
    return [runner.forward(book.batch(batch)) for batch in steps(runner.model_config.vocab_size)]


def runner_config(model_path: Path, rank: int = 0, size: int = 1) -> RunnerConfig:
    return RunnerConfig(
        model_path=model_path,
        tp_rank=rank,
        tp_size=size,
        num_pages=64,
        page_size=PAGE_SIZE,
        max_slots=4,
        max_context_len=64,
    )


def _rank_main(rank: int, size: int, port: int, model_path: Path, out_file: Path) -> None:
    torch.set_num_threads(1)  # up to 4 ranks share 2 cores
    init_tensor_parallel(rank, size, f"tcp://127.0.0.1:{port}", "gloo")
    try:
        with torch.inference_mode():
            logits = run_steps(ModelRunner(runner_config(model_path, rank, size)))
        if rank == 0:
            torch.save(logits, out_file)
        else:
            assert all(x is None for x in logits)
    finally:
        dist.destroy_process_group()


def run_tp(model_path: Path, size: int, tmp_path: Path) -> list[torch.Tensor]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out_file = tmp_path / f"logits-tp{size}.pt"
    mp.spawn(_rank_main, args=(size, port, model_path, out_file), nprocs=size, join=True)
    return torch.load(out_file)


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
