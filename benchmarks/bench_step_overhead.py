"""The fixed cost of a decode step: ModelRunner.step on a tiny Llama (hidden 64, 30 layers,
SmolLM2's vocabulary), where the arithmetic is negligible and what remains is Python, torch
dispatch, metadata and sampling.

Run: .venv/bin/python benchmarks/bench_step_overhead.py [--steps 20] [--repeats 5] [--threads 1] [--clock cpu|wall]
(cpu: this process's CPU time, which other work on the cores does not inflate).
Prints the median milliseconds of a greedy decode step at batch 1 and 32 (context 64 tokens,
page size 1) with the linear layers' fast paths (``prepare_linears``: the native few-row
product here, the weights being too small to pack) and with plain F.linear, alternating; with
--profile, the operators that take the most time in one step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from radixcluster.model_config import load_model_config  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from radixcluster.worker.packed_linear import prepare_linears  # noqa: E402
from radixcluster.worker.weights import expected_shapes  # noqa: E402
from support.paged_batches import Extend, PageBook  # noqa: E402

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 30,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
CONTEXT = 64
# the timer: time.process_time (--clock cpu) or time.perf_counter (--clock wall)
CLOCK = [time.process_time]


def tiny_runner(directory: Path, batch: int) -> ModelRunner:
    (directory / "config.json").write_text(json.dumps(TINY))
    shapes = expected_shapes(load_model_config(directory))
    generator = torch.Generator().manual_seed(0)
    weights = ((name, torch.randn(shape, generator=generator) * 0.05) for name, shape in shapes.items())
    config = RunnerConfig(
        model_path=directory, num_pages=batch * (CONTEXT + 512) + 1, page_size=1, max_slots=batch, max_context_len=2048
    )
    return ModelRunner(config, weights=weights)


def set_fast_linears(runner: ModelRunner, fast: bool) -> None:
    """The runner's own fast linear paths, or none (F.linear throughout)."""
    ops = runner.attention.layer_ops
    prepare_linears(runner.model, fast and runner.config.prepack_weights, ops if fast else replace(ops, matvec=None))


def decode_step_ms(runner: ModelRunner, batch: int, steps: int, profile: bool) -> float:
    book = PageBook(1, runner.config.num_pages)
    result = runner.step(book.batch([Extend(b, list(range(3, 3 + CONTEXT)), 0) for b in range(batch)]))
    times = []
    for step in range(steps):
        fb = book.batch([Extend(b, [int(result.next_token_ids[b])], CONTEXT + step) for b in range(batch)])
        start = CLOCK[0]()
        result = runner.step(fb)
        times.append(CLOCK[0]() - start)
    if profile:
        fb = book.batch([Extend(b, [int(result.next_token_ids[b])], CONTEXT + steps) for b in range(batch)])
        with torch.profiler.profile() as prof:
            runner.step(fb)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    print(f"{args.clock} time, {args.threads} thread(s); median of {args.repeats} x {args.steps} steps per cell")
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (1, 32):
            runner = tiny_runner(Path(tmp), batch)
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for fast in (False, True):
                    set_fast_linears(runner, fast)
                    times[fast].append(decode_step_ms(runner, batch, args.steps, False))
            cells = ", ".join(
                f"{'fast linears' if f else 'F.linear'} {statistics.median(t):.2f} ms" for f, t in times.items()
            )
            print(f"decode step, batch {batch:2d}: {cells}")
            if args.profile:
                decode_step_ms(runner, batch, 2, True)


if __name__ == "__main__":
    main()
