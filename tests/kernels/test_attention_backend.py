"""Choosing the attention backend, by device and by name, and a SmolLM2 runner on the Triton
kernels giving the torch runner's logits."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from radixcluster import server_args  # noqa: E402
from radixcluster.kernels.attention_backend import select_attention_backend  # noqa: E402
from radixcluster.model_config import load_model_config  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from radixcluster.worker.weights import iter_weights  # noqa: E402
from support.paged_batches import Extend, PageBook  # noqa: E402

# Triton runs natively on a GPU, on its interpreter over CPU tensors otherwise (conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(("device", "expected"), [("cpu", "torch"), ("cuda", "triton"), ("cuda:1", "triton")])
def test_auto_is_triton_on_cuda_and_torch_elsewhere(device: str, expected: str) -> None:
    backend = select_attention_backend(device)
    assert backend.name == expected and backend.gather_rows == (expected == "torch")


def test_either_backend_can_be_forced() -> None:
    assert select_attention_backend("cuda", "torch").name == "torch"
    assert select_attention_backend(DEVICE, "triton").name == "triton"


def test_triton_on_cpu_without_the_interpreter_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU-only refusal")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="runs on CUDA devices.*TRITON_INTERPRET=1"):
        select_attention_backend("cpu", "triton")


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        select_attention_backend("cpu", "flashinfer")


def test_the_cli_flag_offers_the_backends() -> None:
    parser = argparse.ArgumentParser()
    server_args.add_cli_args(parser)
    ns = parser.parse_args(["--attention-backend", "triton"])
    assert server_args.server_args_from_namespace(ns).attention_backend == "triton"
    assert parser.parse_args([]).attention_backend == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--attention-backend", "flashinfer"])


def test_runner_on_triton_gives_the_torch_runners_logits(model_path: Path) -> None:
    weights = list(iter_weights(model_path, load_model_config(model_path)))
    runners = {
        name: ModelRunner(
            RunnerConfig(
                model_path=model_path,
                num_pages=8,
                page_size=16,
                max_slots=2,
                max_context_len=64,
                dtype=torch.float32,
                device=DEVICE,
                attention_backend=name,
            ),
            weights=weights,
        )
        for name in ("torch", "triton")
    }
    assert runners["triton"].attention.name == "triton"
    # a prefill of two prompts, then one decode next to a chunk after a cached prefix
    steps = [
        [Extend(0, [1, 504, 3458, 314, 260, 2], 0), Extend(1, [9, 8, 7], 0)],
        [Extend(0, [28], 6), Extend(1, [5, 6], 3)],
    ]
    books = {name: PageBook(16, 8) for name in runners}
    for step in steps:
        ref, ours = (runners[name].forward(books[name].batch(step)) for name in ("torch", "triton"))
        assert float((ours - ref).norm() / ref.norm()) < 1e-4
