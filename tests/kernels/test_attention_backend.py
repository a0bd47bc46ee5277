"""Choosing the attention backend, by device and by name, and SmolLM2 runners on the Triton and
native kernels giving the torch runner's logits."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from radixcluster import server_args  # noqa: E402
from radixcluster.kernels.attention_backend import TORCH_BACKEND, select_attention_backend  # noqa: E402
from radixcluster.model_config import load_model_config  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from radixcluster.worker.weights import iter_weights  # noqa: E402
from support.paged_batches import Extend, PageBook  # noqa: E402

# Triton runs natively on a GPU, on its interpreter over CPU tensors otherwise (conftest.py)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("device", "expected"), [("cpu", "native"), ("cuda", "triton"), ("cuda:1", "triton"), ("meta", "torch")]
)
def test_auto_is_native_on_the_cpu_triton_on_cuda_torch_elsewhere(device: str, expected: str) -> None:
    backend = select_attention_backend(device)
    assert backend.name == expected and backend.gather_rows == (expected == "torch")


def test_every_backend_can_be_forced() -> None:
    assert select_attention_backend("cuda", "torch").name == "torch"
    assert select_attention_backend("cpu", "torch").layer_ops is TORCH_BACKEND.layer_ops
    assert select_attention_backend(DEVICE, "triton").name == "triton"
    native = select_attention_backend("cpu", "native")
    assert native.name == "native" and native.detail == torch.ops.radixcluster.kernel_isa()


def test_native_off_the_cpu_or_for_an_odd_head_dim_says_why() -> None:
    with pytest.raises(ValueError, match="run on the CPU, not 'cuda'"):
        select_attention_backend("cuda", "native")
    with pytest.raises(ValueError, match="head_dim to be a multiple of 16, not 72"):
        select_attention_backend("cpu", "native", head_dim=72)


def test_auto_with_an_odd_head_dim_falls_back_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    assert select_attention_backend("cpu", "auto", head_dim=40) is TORCH_BACKEND
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "native CPU kernels unavailable" in err[0] and "using the torch path" in err[0]


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
        parser.parse_args(["--attention-backend", "no_such_backend"])


@pytest.mark.parametrize(("backend", "device"), [("triton", DEVICE), ("native", "cpu")])
def test_runner_on_kernels_gives_the_torch_runners_logits(model_path: Path, backend: str, device: str) -> None:
    weights = list(iter_weights(model_path, load_model_config(model_path)))
    runners = {
        name: ModelRunner(
            RunnerConfig(
                model_path=model_path,
                num_pages=8,
                page_size=16,
                max_slots=3,
                max_context_len=64,
                dtype=torch.float32,
                device=device,
                attention_backend=name,
            ),
            weights=weights,
        )
        for name in ("torch", backend)
    }
    assert runners[backend].attention.name == backend
    # a prefill of two prompts, then one decode next to a chunk after a cached prefix, then two
    # decodes sharing that prompt's first page (the router's shared-prefix group)
    steps = [
        [Extend(0, [1, 504, 3458, 314, 260, 2, 17, 9, 11, 12, 13, 14, 15, 16, 18, 19, 20], 0), Extend(1, [9, 8, 7], 0)],
        [Extend(0, [28], 17), Extend(1, [5, 6], 3)],
        [Extend(0, [29], 18), Extend(2, [30], 16)],
    ]
    books = {name: PageBook(16, 8) for name in runners}
    for i, step in enumerate(steps):
        batches = {}
        for name, book in books.items():
            if i == 2:
                book.share(0, 2, 16)
            batches[name] = book.batch(step)
            if i == 2:
                batches[name].prefix_groups = np.array([0, 0], dtype=np.int32)
                batches[name].prefix_group_lens = np.array([16], dtype=np.int32)
        ref, ours = (runners[name].forward(batches[name]) for name in ("torch", backend))
        assert float((ours - ref).norm() / ref.norm()) < 1e-5
