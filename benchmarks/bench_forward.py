"""Forward-pass speed of our paged-KV Llama against transformers' on the same model, dtype
(float32) and torch threads: prefill tokens/s and decode steps/s at batch 1 and 16.

Run: .venv/bin/python benchmarks/bench_forward.py [--repeats 5] [--decode-steps 16]
Each measurement alternates transformers and ours, so load from other processes hits both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "worker"))
from paged_batches import Extend, PageBook  # noqa: E402

from radixcluster.model_path import embedded_model_path  # noqa: E402
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig  # noqa: E402


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Pair:
    """transformers' model and our runner holding the same weights."""

    def __init__(self, max_context: int, max_batch: int) -> None:
        from transformers import AutoModelForCausalLM

        path = embedded_model_path()
        self.hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
        config = RunnerConfig(
            model_path=path,
            num_pages=max_batch * max_context // 16 + 1,
            page_size=16,
            max_slots=max_batch,
            max_context_len=max_context,
        )
        self.ours = ModelRunner(config, weights=self.hf.state_dict().items())
        self.vocab = self.hf.config.vocab_size

    def prompts(self, batch: int, length: int) -> torch.Tensor:
        return torch.randint(3, self.vocab, (batch, length), generator=torch.Generator().manual_seed(batch))

    def prefill(self, length: int, repeats: int) -> tuple[float, float]:
        """Median seconds of a ``length``-token prefill, transformers then ours."""
        ids = self.prompts(1, length)
        hf_times, our_times = [], []
        for _ in range(repeats):
            hf_times.append(timed(lambda: self.hf(ids)))
            batch = PageBook(16, self.ours.config.num_pages).batch([Extend(0, ids[0].tolist(), 0)])
            our_times.append(timed(lambda batch=batch: self.ours.forward(batch)))
        return statistics.median(hf_times), statistics.median(our_times)

    def decode(self, batch: int, context: int, steps: int) -> tuple[float, float]:
        """Median seconds of one decode step of ``batch`` requests after ``context`` tokens."""
        ids = self.prompts(batch, context)
        out = self.hf(ids, use_cache=True)
        cache, hf_next = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        book = PageBook(16, self.ours.config.num_pages)
        logits = self.ours.forward(book.batch([Extend(b, ids[b].tolist(), 0) for b in range(batch)]))
        our_next = logits.argmax(-1).tolist()
        hf_times, our_times = [], []
        for step in range(steps):
            start = time.perf_counter()
            out = self.hf(hf_next, past_key_values=cache, use_cache=True)
            cache, hf_next = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            hf_times.append(time.perf_counter() - start)
            fb = book.batch([Extend(b, [our_next[b]], context + step) for b in range(batch)])
            start = time.perf_counter()
            our_next = self.ours.forward(fb).argmax(-1).tolist()
            our_times.append(time.perf_counter() - start)
        return statistics.median(hf_times), statistics.median(our_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-len", type=int, default=512)
    parser.add_argument("--context", type=int, default=128, help="tokens before the decode steps")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decode-steps", type=int, default=16)
    args = parser.parse_args()
    pair = Pair(max_context=max(args.prefill_len, args.context + args.decode_steps) + 16, max_batch=16)
    rows = []
    with torch.inference_mode():
        hf, ours = pair.prefill(args.prefill_len, args.repeats)
        rows.append((f"prefill {args.prefill_len} tok (tok/s)", args.prefill_len / hf, args.prefill_len / ours))
        for batch in (1, 16):
            hf, ours = pair.decode(batch, args.context, args.decode_steps)
            rows.append((f"decode batch {batch} (steps/s)", 1 / hf, 1 / ours))
    print(
        f"torch threads: {torch.get_num_threads()}, dtype float32, median of {args.repeats} prefills / {args.decode_steps} steps"
    )
    print(f"{'':32} {'transformers':>13} {'ours':>10} {'ours/hf':>8}")
    for name, hf_rate, our_rate in rows:
        print(f"{name:32} {hf_rate:13.2f} {our_rate:10.2f} {our_rate / hf_rate:8.2f}")


if __name__ == "__main__":
    main()
