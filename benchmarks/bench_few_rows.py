"""A decode step's linear work at a few rows: the native product (kernels/csrc/matvec.cpp, on
blocked weights) against what serves those rows without it (oneDNN's packed weight for 2 to 128
rows where the layer has one, else F.linear: MKL's gemv at one row), on SmolLM2's 30 layers and
LM head, every weight its own tensor so that each is read from memory as in a real step; in
bfloat16 also F.linear on the operands widened to float32 (what serves more rows on a CPU
without bfloat16 arithmetic). Each path goes through the layers' own ``linear``. Up to how many
rows the native product serves is what ``packed_max_rows`` in worker/packed_linear.py encodes.

Run: .venv/bin/python benchmarks/bench_few_rows.py [--threads 2] [--repeats 7] [--dtype float32]
[--rows 1 2 4 8 16 32 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from radixcluster.bench.machine import cpu_model, load_average
from radixcluster.kernels import native
from radixcluster.kernels.native_ops import native_block_weight, native_matvec
from radixcluster.worker.packed_linear import PACK_MIN_PARAMS, FastLinear, linear, pack_weight

# SmolLM2-135M, [out, in]: qkv_proj, o_proj, gate_up_proj, down_proj (each in 30 layers), the LM head
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def step_linear(
    weights: list[torch.Tensor], paths: dict[str, list[FastLinear]], rows: int, dtype: torch.dtype
) -> dict[str, Callable[[], object]]:
    """The step's linear products of ``rows`` rows, through each of ``paths`` (one FastLinear
    per weight), by the layers' own ``linear``."""
    xs = {k: torch.randn(rows, k).to(dtype) for k in {w.shape[1] for w in weights}}

    def through(fasts: list[FastLinear]) -> Callable[[], object]:
        return lambda: [linear(xs[w.shape[1]], w, fast) for w, fast in zip(weights, fasts)]

    return {name: through(fasts) for name, fasts in paths.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.load()
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    weights = [(torch.randn(shape, generator=generator) * 0.02).to(dtype) for shape in SHAPES]
    paths = {
        "blas": [FastLinear(pack_weight(w) if w.numel() >= PACK_MIN_PARAMS else None) for w in weights],
        "native": [
            FastLinear(matvec=native_matvec, blocked=native_block_weight(w), matvec_rows=max(args.rows))
            for w in weights
        ],
    }
    if dtype != torch.float32:
        paths["widened"] = [FastLinear(widen=True) for _ in weights]
    gigabytes = sum(w.numel() * w.element_size() for w in weights) / 1e9
    print(f"{cpu_model()}, load {load_average()}, {args.threads} threads, {args.dtype}, medians of {args.repeats}")
    widened = "" if dtype == torch.float32 else " widened to fp32 ms |"
    print(f"| rows | oneDNN packed / F.linear ms | native ms | native reads the weights at | speed-up |{widened}")
    print("|---|---|---|---|---|" + ("---|" if widened else ""))
    with torch.inference_mode():
        for rows in args.rows:
            fns = step_linear(weights, paths, rows, dtype)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for fn in fns.values():
                fn()
            for _ in range(args.repeats):
                for name, fn in fns.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            blas, ours = (statistics.median(times[name]) for name in ("blas", "native"))
            row = f"| {rows} | {blas * 1e3:.1f} | {ours * 1e3:.1f} | {gigabytes / ours:.1f} GB/s | {blas / ours:.2f}× |"
            if "widened" in times:
                row += f" {statistics.median(times['widened']) * 1e3:.1f} |"
            print(row)


if __name__ == "__main__":
    main()
