"""The prepacked-weight crossover: oneDNN with prepacked weights against F.linear (MKL in
float32) on SmolLM2's linear shapes, over the number of input rows M, in float32 and bfloat16.

Run: .venv/bin/python benchmarks/bench_linear.py [--threads 1] [--repeats 5] [--clock cpu|wall]
The default clock is this process's CPU time, which other work on the cores does not inflate
(with one thread it is the arithmetic's time); use --clock wall --threads 2 on a quiet machine.
Prints, per dtype, a markdown table of F.linear's time and the speed-up of the packed weight
(F.linear time / packed time; > 1: packed is faster), measured alternately, medians, and the
speed-up on a whole step's linear work; the window of M where that is >= 1 is what
PACKED_MIN_ROWS..PACKED_MAX_ROWS in worker/packed_linear.py encode.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from radixcluster.bench.machine import cpu_model, load_average
from radixcluster.worker.packed_linear import PACK_FOR_ROWS, PACK_MIN_PARAMS, pack_weight

# the timer: time.process_time (--clock cpu) or time.perf_counter (--clock wall)
CLOCK = [time.process_time]
# SmolLM2-135M, [out, in]: qkv_proj, o_proj, gate_up_proj, down_proj (each in 30 layers), the LM head
LAYER_SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
SHAPES = {**LAYER_SHAPES, "lm_head": (49152, 576)}
LAYERS = 30
ROWS = (1, 2, 4, 8, 32, 64, 128, 256, 512, 2048)


def seconds_per_call(fn: Callable[[], object], flops: float) -> float:
    """Seconds per call, over enough calls for ~1 GFLOP (a warm-up call first)."""
    calls = max(1, int(1e9 / flops))
    fn()
    start = CLOCK[0]()
    for _ in range(calls):
        fn()
    return (CLOCK[0]() - start) / calls


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


# (F.linear seconds, packed seconds or None) per (shape, M)
Results = dict[tuple[str, int], tuple[float, float | None]]


def measure(dtype: torch.dtype, repeats: int) -> Results:
    """(F.linear seconds, packed seconds or None) per (shape, M), medians of alternating runs."""
    results = {}
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features).to(dtype)
        packed = pack_weight(weight)
        for rows in ROWS:
            x = torch.randn(rows, in_features).to(dtype)
            flops = 2.0 * rows * out_features * in_features
            plain, fast = [], []
            for _ in range(repeats):
                plain.append(seconds_per_call(lambda x=x, w=weight: F.linear(x, w), flops))
                if packed is not None:
                    fast.append(seconds_per_call(lambda x=x, p=packed: _packed_linear(x, p), flops))
            results[name, rows] = (statistics.median(plain), statistics.median(fast) if fast else None)
    return results


def step_speedup(results: Results, rows: int) -> float | None:
    """The packed weights' speed-up on all of a step's linear work at M rows: 30 layers of the
    four projections plus the LM head, each weighted by its time; weights under PACK_MIN_PARAMS
    run F.linear either way, as in the server."""
    if results["lm_head", rows][1] is None:
        return None
    counts = {name: LAYERS for name in LAYER_SHAPES} | {"lm_head": 1}
    plain = sum(count * results[name, rows][0] for name, count in counts.items())
    fast = sum(count * results[name, rows][_packs(name)] for name, count in counts.items())
    return plain / fast


def _packs(name: str) -> int:
    """1 (the packed time) for shapes the server packs, 0 (F.linear's) for the others."""
    out_features, in_features = SHAPES[name]
    return int(out_features * in_features >= PACK_MIN_PARAMS)


def table(results: Results) -> str:
    lines = ["| shape [out, in] | " + " | ".join(f"M={m}" for m in ROWS) + " |", "|---|" + "---|" * len(ROWS)]
    for name, shape in SHAPES.items():
        cells = []
        for rows in ROWS:
            plain, fast = results[name, rows]
            cells.append(f"{plain * 1e3:.3g} ms, " + ("n/a" if fast is None else f"{plain / fast:.2f}x"))
        lines.append(f"| {name} {list(shape)} | " + " | ".join(cells) + " |")
    speedups = [step_speedup(results, rows) for rows in ROWS]
    lines.append(
        f"| a step (30 layers + LM head; weights under {PACK_MIN_PARAMS:,} unpacked) | "
        + " | ".join(_cell(v) for v in speedups)
        + " |"
    )
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"**{value:.2f}x**"


def packed_window(results: Results) -> tuple[int, int] | None:
    """The widest run of consecutive M in ROWS where the packed weights speed up a step."""
    best: tuple[int, int] | None = None
    start: int | None = None
    for i, rows in enumerate(ROWS):
        value = step_speedup(results, rows)
        if value is None or value < 1.0:
            start = None
            continue
        start = i if start is None else start
        if best is None or i - start > ROWS.index(best[1]) - ROWS.index(best[0]):
            best = (ROWS[start], rows)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"{args.clock} time; CPU: {cpu_model()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    )
    print(
        f"{args.threads} threads, packed for M={PACK_FOR_ROWS}, median of {args.repeats}; load before: {load_average()}"
    )
    with torch.inference_mode():
        for name in args.dtypes:
            results = measure(getattr(torch, name), args.repeats)
            print(f"\n{name}: F.linear time, and the packed weight's speed-up over it\n")
            print(table(results))
            print(f"\n{name}: the packed weights speed up a step for M in {packed_window(results)}")
    print(f"\nload after: {load_average()}")


if __name__ == "__main__":
    main()
