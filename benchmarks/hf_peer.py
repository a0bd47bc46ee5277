"""Hugging Face transformers as a benchmark peer; runs in its own venv (benchmarks/.venv-hf),
so it imports nothing from radixcluster.

  convert GGUF OUT_DIR        write a float32 Hugging Face directory from the GGUF (for vLLM)
  run SPEC.json OUT.json      serve a workload with static batching (padded `generate` batches)

The workload spec is what compare_peers.py writes: conversations of token-id segments (a
turn's prompt is the previous prompt, its answer, then the segment; ``after`` continues
another conversation). Requests whose dependencies are met form one wave; each wave runs in
padded batches of --batch-size. The output is a list of request records in submission order.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM, StoppingCriteria

PAD_ID = 0


def load(gguf: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()


def convert(gguf: Path, out_dir: Path) -> None:
    model = load(gguf)
    config = model.config
    # The directory holds plain float32 weights: a GGUF quantization_config would misdescribe them.
    del config.quantization_config
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(model.state_dict())
    fresh.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out_dir)


class StepClock(StoppingCriteria):
    """Called once per generated token of the batch: records when each step ended."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def generate_batch(model, prompts: list[list[int]], output_len: int) -> tuple[list[list[int]], list[float], float]:
    """Left-padded greedy generation of exactly ``output_len`` tokens per prompt; returns the
    outputs, the step end times and the start time."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    clock = StepClock()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
            pad_token_id=PAD_ID,
            stopping_criteria=[clock],
        )
    return out[:, width:].tolist(), clock.times, start


def run(model, spec: dict, batch_size: int) -> list[dict]:
    convs = spec["conversations"]
    contexts: dict[int, list[int]] = {}
    next_turn = [0] * len(convs)
    finished: set[int] = set()
    records: list[dict] = []
    t0 = time.perf_counter()
    while len(finished) < len(convs):
        wave = [i for i, c in enumerate(convs) if i not in finished and (c["after"] is None or c["after"] in finished)]
        for b in range(0, len(wave), batch_size):
            batch = wave[b : b + batch_size]
            prompts = []
            for i in batch:
                after = convs[i]["after"]
                base = contexts[i] if next_turn[i] else contexts[after] if after is not None else []
                prompts.append(base + convs[i]["segments"][next_turn[i]])
            outputs, steps, start = generate_batch(model, prompts, spec["output_len"])
            for i, prompt, output in zip(batch, prompts, outputs):
                records.append(
                    {
                        "conversation": i,
                        "turn": next_turn[i],
                        "prompt_ids": prompt,
                        "output_ids": output,
                        "submit": start - t0,
                        "ttft": steps[0] - start,
                        "latency": steps[-1] - start,
                        "itl": [later - early for early, later in zip(steps, steps[1:])],
                        "cached_tokens": None,
                        "error": None,
                    }
                )
                contexts[i] = prompt + output
                next_turn[i] += 1
                if next_turn[i] == len(convs[i]["segments"]):
                    finished.add(i)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert")
    conv.add_argument("gguf", type=Path)
    conv.add_argument("out_dir", type=Path)
    run_cmd = sub.add_parser("run")
    run_cmd.add_argument("spec", type=Path)
    run_cmd.add_argument("out", type=Path)
    run_cmd.add_argument("--gguf", type=Path, required=True)
    run_cmd.add_argument("--batch-size", type=int, default=64)
    run_cmd.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.command == "convert":
        convert(args.gguf, args.out_dir)
        return
    torch.set_num_threads(args.threads)
    model = load(args.gguf)
    generate_batch(model, [[1, 2, 3, 4] * 8], 2)  # the first prefill after loading is several times slower
    spec = json.loads(args.spec.read_text())
    start = time.perf_counter()
    records = run(model, spec, args.batch_size)
    args.out.write_text(json.dumps({"duration_s": time.perf_counter() - start, "records": records}))


if __name__ == "__main__":
    main()
