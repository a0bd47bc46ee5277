"""The ranks of the tensor-parallel tests (tests/worker/test_tensor_parallel.py): what each
spawned process runs, in a module it can import (a test module's name may not be importable
there), and the steps every tp size runs."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from radixcluster.worker.parallel import init_tensor_parallel
from support.paged_batches import Extend, PageBook

PAGE_SIZE = 4
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


def rank_main(rank: int, size: int, port: int, model_path: Path, out_file: Path) -> None:
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
    mp.spawn(rank_main, args=(size, port, model_path, out_file), nprocs=size, join=True)
    return torch.load(out_file)
