"""How often a runner in another numeric mode (bf16, an fp8 KV cache) picks float32's greedy
token on the reference prompts: each step is fed float32's token, so one early difference does
not turn every later position into a mismatch."""

from __future__ import annotations

from pathlib import Path

import torch

from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from support.paged_batches import Extend, PageBook
from support.reference_prompts import RUNNER_PROMPTS, SERVER_NEW_TOKENS, SERVER_PROMPTS

PROMPTS = RUNNER_PROMPTS + SERVER_PROMPTS


def reference_runner(
    model_path: Path,
    hf_model: torch.nn.Module,
    dtype: torch.dtype,
    kv_cache_dtype: torch.dtype | None = None,
    attention_backend: str = "auto",
) -> ModelRunner:
    """A runner for every prompt of PROMPTS at once, on transformers' weights."""
    config = RunnerConfig(
        model_path=model_path,
        num_pages=256,
        page_size=16,
        max_slots=len(PROMPTS),
        max_context_len=256,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        attention_backend=attention_backend,
    )
    return ModelRunner(config, weights=hf_model.state_dict().items())


def greedy(runner: ModelRunner, prompts: list[list[int]], forced: list[list[int]] | None = None) -> list[list[int]]:
    """The runner's greedy choice at each of SERVER_NEW_TOKENS steps after each prompt, all
    prompts in one batch; with ``forced``, the next input is ``forced``'s token, not its own."""
    book = PageBook(runner.config.page_size, runner.config.num_pages)
    result = runner.step(book.batch([Extend(slot, p, 0) for slot, p in enumerate(prompts)]))
    chosen = [[int(t)] for t in result.next_token_ids]
    for step in range(SERVER_NEW_TOKENS - 1):
        fed = [(forced or chosen)[slot][step] for slot in range(len(prompts))]
        result = runner.step(book.batch([Extend(s, [fed[s]], len(p) + step) for s, p in enumerate(prompts)]))
        for out, token in zip(chosen, result.next_token_ids):
            out.append(int(token))
    return chosen


def agreement(runner: ModelRunner, prompts: list[list[int]], reference: list[list[int]]) -> tuple[float, int]:
    """The share of ``reference``'s greedy tokens the runner also picks, fed the reference's
    tokens, and how many tokens that counts."""
    predicted = greedy(runner, prompts, forced=reference)
    pairs = [(p, r) for pred, ref in zip(predicted, reference) for p, r in zip(pred, ref)]
    return sum(p == r for p, r in pairs) / len(pairs), len(pairs)
