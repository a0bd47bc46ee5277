"""bfloat16 on CPU as a real mode: the runner keeps bf16 weights and a bf16 KV cache, samples from
float32 logits, and, fed float32's greedy tokens, picks the same next token at >= 95 % of the
first SERVER_NEW_TOKENS positions of the reference prompts (those the float32 runner and server
match transformers on). Never an equality test: bf16 rounding moves near-ties."""

from __future__ import annotations

import pytest
import torch

from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from support.paged_batches import Extend, PageBook
from support.reference_prompts import RUNNER_PROMPTS, SERVER_NEW_TOKENS, SERVER_PROMPTS

PROMPTS = RUNNER_PROMPTS + SERVER_PROMPTS


def _runner(model_path, hf_model, dtype: torch.dtype) -> ModelRunner:
    config = RunnerConfig(
        model_path=model_path, num_pages=256, page_size=16, max_slots=len(PROMPTS), max_context_len=256, dtype=dtype
    )
    return ModelRunner(config, weights=hf_model.state_dict().items())


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module")
def bf16_runner(model_path, hf_model) -> ModelRunner:
    return _runner(model_path, hf_model, torch.bfloat16)


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


def test_bf16_weights_and_cache_with_float32_logits(bf16_runner, prompts):
    assert {p.dtype for p in bf16_runner.model.parameters()} == {torch.bfloat16}
    assert bf16_runner.kv_pool.k[0].dtype == torch.bfloat16
    logits = bf16_runner.forward(PageBook(16, 256).batch([Extend(0, prompts[0], 0)]))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_bf16_greedy_agrees_with_fp32_on_95_percent_of_tokens(model_path, hf_model, bf16_runner, prompts):
    reference = greedy(_runner(model_path, hf_model, torch.float32), prompts)
    predicted = greedy(bf16_runner, prompts, forced=reference)
    pairs = [(p, r) for pred, ref in zip(predicted, reference) for p, r in zip(pred, ref)]
    agreement = sum(p == r for p, r in pairs) / len(pairs)
    assert agreement >= 0.95, f"bf16 agrees with fp32 on {agreement:.1%} of {len(pairs)} greedy tokens"
