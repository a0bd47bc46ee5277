"""Forward-pass speed on the embedded SmolLM2-135M, the attention backends side by side.

Run: .venv/bin/python benchmarks/bench_forward.py [--sections split few layers kernels transformers] [--repeats 5] [--threads N]

- split: one decode step of the shared-prefix workload (32 requests, 8 groups x 4 sharing 620
  tokens, context 660, page size 1) on the torch and native backends, fp32 and bf16: the step's
  median wall time and its attention / linear / other split (torch.profiler).
- few: decode steps of 1 to 32 requests (context 740 each) on the native backend, their layers
  one by one with linear products without the native few-row product (oneDNN's packed weights,
  MKL's gemv for one row; bf16 widened to fp32 where the CPU has no bf16 arithmetic), against
  all layers in one native call through it (up to 32 rows whatever ``MATVEC_ROWS`` says: where
  it stops winning is what that encodes), fp32 and bf16.
- layers: decode steps of 1 and 4 requests (context 740 each) and of the shared-prefix workload's
  32, native backend: the layers one by one (Python between the kernels) against all of them in
  one native call (``LayerOps.decoder_layers``), fp32 and bf16. The other sections run the
  layers one by one, so that the profiler sees each layer's attention.
- kernels: one layer's attention call at the workload's shapes (decode B=32 ctx 660 shared,
  and the same planned as if nothing were shared; extend 644 over no prefix; 8 extends of 24
  over a shared 620), native vs torch.
- transformers: our runner (torch attention, page size 16) against transformers' forward.
Every measurement alternates the things compared, so load from other processes hits both;
figures are medians, and on a shared machine only the ratios mean much.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent
sys.path[:0] = [str(ROOT), str(ROOT.parent / "tests")]
from shared_prefix_step import Workload, decode_tables, groups_of  # noqa: E402

from radixcluster.kernels.attention import build_attention_metadata, paged_attention  # noqa: E402
from radixcluster.kernels.attention_backend import select_attention_backend  # noqa: E402
from radixcluster.model_config import load_model_config  # noqa: E402
from radixcluster.model_path import embedded_model_path  # noqa: E402
from radixcluster.protocol import ForwardBatch  # noqa: E402
from radixcluster.server_args import FP8_KV_CACHE_DTYPES, KV_CACHE_DTYPES  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402
from radixcluster.worker.packed_linear import prepare_linears  # noqa: E402
from radixcluster.worker.weights import iter_weights  # noqa: E402
from support.paged_batches import Extend, PageBook, greedy_sampling  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BACKENDS = ("torch", "native")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternating(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each function, run in turn ``repeats`` times after one warm-up."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


# ---------------------------------------------------------------- the decode-step split


def decode_runner(
    backend: str,
    dtype: torch.dtype,
    w: Workload,
    weights: list,
    in_one_call: bool = False,
    kv_cache_dtype: torch.dtype | None = None,
) -> ModelRunner:
    """A runner whose KV pool (of ``kv_cache_dtype``, default ``dtype``) holds the workload
    (random K/V); its layers run one by one, each one's attention call marked for the profiler,
    unless ``in_one_call`` (where the backend can)."""
    runner = ModelRunner(
        RunnerConfig(
            model_path=embedded_model_path(),
            num_pages=w.rows,
            page_size=1,
            max_slots=w.batch,
            max_context_len=w.context + 1,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            attention_backend=backend,
        ),
        weights=weights,
    )
    gen = torch.Generator().manual_seed(0)
    for cache in (*runner.kv_pool.k, *runner.kv_pool.v):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    runner.kv_pool.page_table[: w.batch] = torch.from_numpy(decode_tables(w))
    if in_one_call:
        return runner
    attention = runner.attention

    def marked(*args: object) -> torch.Tensor:
        with record_function("attention"):
            return attention.paged_attention(*args)

    ops = dataclasses.replace(attention.layer_ops, decoder_layers=None)
    for layer in runner.model.model.layers:
        layer.self_attn.attention = dataclasses.replace(attention, paged_attention=marked, layer_ops=ops)
    return runner


def decode_batch(w: Workload, vocab: int) -> ForwardBatch:
    groups, lens = groups_of(w)
    none = np.zeros(0, dtype=np.int32)
    return ForwardBatch(
        step_id=1,
        input_ids=np.random.default_rng(0).integers(3, vocab, w.batch, dtype=np.int32),
        positions=np.full(w.batch, w.context, dtype=np.int32),
        slots=np.arange(w.batch, dtype=np.int32),
        prefix_lens=np.full(w.batch, w.context, dtype=np.int32),
        extend_lens=np.ones(w.batch, dtype=np.int32),
        table_slots=none,
        table_starts=none,
        table_counts=none,
        table_pages=none,
        sampling=greedy_sampling(w.batch),
        prefix_groups=groups,
        prefix_group_lens=lens,
    )


def step_split(runner: ModelRunner, batch: ForwardBatch) -> tuple[float, float]:
    """Shares of one profiled step spent in attention and in linear layers."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step"):
            runner.forward(batch)
    totals = {e.key: e.cpu_time_total for e in prof.key_averages()}
    linear = sum(t for name, t in totals.items() if "linear" in name or "matvec" in name)
    return totals["attention"] / totals["step"], linear / totals["step"]


def kv_dtype(name: str) -> torch.dtype | None:
    """The torch dtype of a --kv-cache-dtype choice (None: the model's)."""
    return None if name == "auto" else getattr(torch, FP8_KV_CACHE_DTYPES[name])


def run_split(w: Workload, repeats: int, kv_cache_dtypes: list[str]) -> None:
    """The torch reference against the native backend, which also runs with each fp8 cache of
    ``kv_cache_dtypes``."""
    print(
        f"\n## decode step: {w.batch} requests, {w.groups} groups x {w.per_group} sharing {w.shared} tokens, context {w.context}, page size 1"
    )
    print("| dtype | backend | KV cache | step ms | attention | linear | other | step speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    path = embedded_model_path()
    weights = list(iter_weights(path, load_model_config(path)))
    for label, dtype in DTYPES.items():
        runs = [(b, "auto") for b in BACKENDS] + [("native", kv) for kv in kv_cache_dtypes if kv != "auto"]
        runners = {(b, kv): decode_runner(b, dtype, w, weights, kv_cache_dtype=kv_dtype(kv)) for b, kv in runs}
        batch = decode_batch(w, runners["torch", "auto"].model_config.vocab_size)
        with torch.inference_mode():
            times = alternating({run: partial(r.forward, batch) for run, r in runners.items()}, repeats)
            for (b, kv), runner in runners.items():
                attention, linear = step_split(runner, batch)
                speedup = times["torch", "auto"] / times[b, kv]
                cache = label if kv == "auto" else kv
                print(
                    f"| {label} | {b} | {cache} | {times[b, kv] * 1e3:.1f} | {attention:.0%} | {linear:.0%} "
                    f"| {1 - attention - linear:.0%} | {speedup:.2f}x |"
                )


# ---------------------------------------------------------------- one request's decode step


def run_few(repeats: int) -> None:
    print(
        "\n## decode steps of a few requests (context 740 each, nothing shared), native backend: the layers one"
        " by one without the native few-row product (oneDNN's packed weights, MKL's F.linear for one row and"
        " o_proj; bf16 widened to fp32 where the CPU has no bf16 arithmetic) or in one call through it"
    )
    print("| requests | dtype | without it ms | native ms | speed-up | max abs diff of the logits |")
    print("|---|---|---|---|---|---|")
    path = embedded_model_path()
    weights = list(iter_weights(path, load_model_config(path)))
    for requests in (1, 2, 4, 8, 16, 32):
        w = Workload(groups=requests, per_group=1, shared=700)
        for label, dtype in DTYPES.items():
            runners = {
                name: decode_runner("native", dtype, w, weights, in_one_call=True) for name in ("blas", "native")
            }
            ops = runners["native"].attention.layer_ops
            prepare_linears(runners["blas"].model, prepack=True, ops=dataclasses.replace(ops, matvec=None))
            prepare_linears(runners["native"].model, prepack=True, ops=dataclasses.replace(ops, matvec_rows=32))
            batch = decode_batch(w, runners["blas"].model_config.vocab_size)
            with torch.inference_mode():
                times = alternating({name: partial(r.forward, batch) for name, r in runners.items()}, repeats)
                diff = (runners["blas"].forward(batch) - runners["native"].forward(batch)).abs().max().item()
            print(
                f"| {requests} | {label} | {times['blas'] * 1e3:.1f} | {times['native'] * 1e3:.1f} "
                f"| {times['blas'] / times['native']:.2f}x | {diff:.1e} |"
            )


def run_layers(w: Workload, repeats: int) -> None:
    print("\n## decode steps, native backend: the layers one by one against all of them in one native call")
    print("| requests | dtype | one by one ms | one call ms | speed-up | logits equal |")
    print("|---|---|---|---|---|---|")
    path = embedded_model_path()
    weights = list(iter_weights(path, load_model_config(path)))
    workloads = [Workload(groups=1, per_group=1, shared=700), Workload(groups=4, per_group=1, shared=700), w]
    for work in workloads:
        for label, dtype in DTYPES.items():
            runners = {c: decode_runner("native", dtype, work, weights, in_one_call=c) for c in (False, True)}
            batch = decode_batch(work, runners[False].model_config.vocab_size)
            with torch.inference_mode():
                times = alternating({c: partial(r.forward, batch) for c, r in runners.items()}, repeats)
                equal = torch.equal(runners[False].forward(batch), runners[True].forward(batch))
            print(
                f"| {work.batch} | {label} | {times[False] * 1e3:.1f} | {times[True] * 1e3:.1f} "
                f"| {times[False] / times[True]:.2f}x | {equal} |"
            )


# ---------------------------------------------------------------- the kernel microbench


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    name: str
    prefix: list[int]  # per request
    new: list[int]
    shared: int  # tokens every request shares (0: none)


def shapes(w: Workload) -> list[Shape]:
    return [
        Shape(
            f"decode B={w.batch} ctx {w.context + 1}, {w.groups}x{w.per_group} shared {w.shared}",
            [w.context] * w.batch,
            [1] * w.batch,
            w.shared,
        ),
        Shape(f"decode B={w.batch} ctx {w.context + 1}, nothing shared", [w.context] * w.batch, [1] * w.batch, 0),
        Shape(f"extend {w.shared + w.question}, prefix 0", [0], [w.shared + w.question], 0),
        Shape(
            f"{w.per_group * 2} x extend {w.question} over shared {w.shared}",
            [w.shared] * (w.per_group * 2),
            [w.question] * (w.per_group * 2),
            w.shared,
        ),
    ]


def kernel_inputs(shape: Shape, w: Workload, dtype: torch.dtype, heads: tuple[int, int, int]):
    """q, caches and the page table of one shape; decodes use the workload's layout."""
    num_heads, kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(0)
    if shape.new[0] == 1:
        table = torch.from_numpy(decode_tables(w))
        groups, lens = groups_of(w) if shape.shared else (None, None)
        rows = w.rows
    else:
        n = len(shape.new)
        prefix, new = shape.prefix[0], shape.new[0]
        rows = 1 + prefix + n * new
        table = torch.zeros(n, prefix + new, dtype=torch.int32)
        table[:, :prefix] = torch.arange(1, prefix + 1, dtype=torch.int32)
        for b in range(n):
            table[b, prefix:] = torch.arange(1 + prefix + b * new, 1 + prefix + (b + 1) * new)
        groups = np.zeros(n, dtype=np.int32) if shape.shared else None
        lens = np.array([shape.shared], dtype=np.int32) if shape.shared else None
    k = torch.randn(rows, 1, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(rows, 1, kv_heads, head_dim, generator=gen).to(dtype)
    q = torch.randn(sum(shape.new), num_heads, head_dim, generator=gen).to(dtype)
    return q, k, v, table, torch.tensor(shape.prefix), torch.tensor(shape.new), groups, lens


def run_kernels(w: Workload, repeats: int) -> None:
    config = load_model_config(embedded_model_path())
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    native = select_attention_backend("cpu", "native", config.head_dim)
    print(
        f"\n## one layer's attention ({heads[0]} heads, {heads[1]} KV heads, head_dim {heads[2]}; native kernels: {native.detail})"
    )
    print("| shape | dtype | torch ms | native ms | speed-up | max abs diff |")
    print("|---|---|---|---|---|---|")
    scale = config.head_dim**-0.5
    for shape in shapes(w):
        for label, dtype in DTYPES.items():
            q, k, v, table, prefix, new, groups, lens = kernel_inputs(shape, w, dtype, heads)
            reference = build_attention_metadata(table, prefix, new, 1)
            planned = build_attention_metadata(
                table, prefix, new, 1, gather_rows=False, shared_groups=groups, shared_lens=lens
            )
            fns = {
                "torch": partial(paged_attention, q, k, v, reference, scale),
                "native": partial(native.paged_attention, q, k, v, planned, scale),
            }
            with torch.inference_mode():
                times = alternating(fns, repeats)
                diff = (fns["native"]().float() - fns["torch"]().float()).abs().max().item()
            print(
                f"| {shape.name} | {label} | {times['torch'] * 1e3:.2f} | {times['native'] * 1e3:.2f} "
                f"| {times['torch'] / times['native']:.2f}x | {diff:.1e} |"
            )


# ---------------------------------------------------------------- against transformers


def run_transformers(repeats: int, prefill_len: int = 512, context: int = 128, steps: int = 12) -> None:
    from transformers import AutoModelForCausalLM

    path = embedded_model_path()
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    pages = 16 * (max(prefill_len, context + steps) + 16) // 16 + 1
    config = RunnerConfig(
        model_path=path,
        num_pages=pages,
        page_size=16,
        max_slots=16,
        max_context_len=prefill_len + context + steps,
        attention_backend="torch",
    )
    ours = ModelRunner(config, weights=hf.state_dict().items())
    gen = torch.Generator().manual_seed(0)
    print("\n## against transformers (fp32, torch attention, page size 16)")
    print("| measurement | transformers | ours | ours / transformers |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        ids = torch.randint(3, hf.config.vocab_size, (1, prefill_len), generator=gen)
        batch = lambda: PageBook(16, pages).batch([Extend(0, ids[0].tolist(), 0)])  # noqa: E731
        times = alternating({"hf": lambda: hf(ids), "ours": lambda: ours.forward(batch())}, repeats)
        print(
            f"| prefill {prefill_len} tokens (tok/s) | {prefill_len / times['hf']:.1f} | {prefill_len / times['ours']:.1f} | {times['hf'] / times['ours']:.2f} |"
        )
        for size in (1, 16):
            hf_rate, our_rate = _decode_rates(hf, ours, pages, size, context, steps, gen)
            print(f"| decode batch {size} (steps/s) | {hf_rate:.2f} | {our_rate:.2f} | {our_rate / hf_rate:.2f} |")


def _decode_rates(
    hf, ours: ModelRunner, pages: int, batch: int, context: int, steps: int, gen: torch.Generator
) -> tuple[float, float]:
    ids = torch.randint(3, hf.config.vocab_size, (batch, context), generator=gen)
    out = hf(ids, use_cache=True)
    cache, hf_next = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    book = PageBook(16, pages)
    our_next = ours.forward(book.batch([Extend(b, ids[b].tolist(), 0) for b in range(batch)])).argmax(-1).tolist()
    hf_times, our_times = [], []
    for step in range(steps):
        start = time.perf_counter()
        out = hf(hf_next, past_key_values=cache, use_cache=True)
        cache, hf_next = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        hf_times.append(time.perf_counter() - start)
        fb = book.batch([Extend(b, [our_next[b]], context + step) for b in range(batch)])
        start = time.perf_counter()
        our_next = ours.forward(fb).argmax(-1).tolist()
        our_times.append(time.perf_counter() - start)
    return 1 / statistics.median(hf_times), 1 / statistics.median(our_times)


def steady_allocator() -> None:
    """glibc keeps freed memory in the process (mmap and trim thresholds at 1 GiB): otherwise
    the torch reference's large temporaries are unmapped and faulted in again at every call,
    which slowed a section run alone (kernels: fp32 2-4x, native calls too) and not one run
    after the split's allocations had raised glibc's own thresholds."""
    libc = ctypes.CDLL(None)
    if hasattr(libc, "mallopt"):
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, 1 << 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sections",
        nargs="+",
        choices=["split", "few", "layers", "kernels", "transformers"],
        default=["split", "few", "layers", "kernels"],
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--kv-cache-dtypes",
        nargs="+",
        choices=KV_CACHE_DTYPES,
        default=["auto"],
        help="split: the native backend's step with these KV caches too (auto: the model's dtype)",
    )
    args = parser.parse_args()
    steady_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    w = Workload()
    print(f"torch threads: {torch.get_num_threads()}; medians of {args.repeats} alternating runs")
    if "split" in args.sections:
        run_split(w, args.repeats, args.kv_cache_dtypes)
    if "few" in args.sections:
        run_few(args.repeats)
    if "layers" in args.sections:
        run_layers(w, args.repeats)
    if "kernels" in args.sections:
        run_kernels(w, args.repeats)
    if "transformers" in args.sections:
        run_transformers(args.repeats)


if __name__ == "__main__":
    main()
