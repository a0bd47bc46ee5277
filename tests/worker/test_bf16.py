"""bfloat16 on CPU as a real mode: the runner keeps bf16 weights and a bf16 KV cache, samples from
float32 logits, and, fed float32's greedy tokens, picks the same next token at >= 95 % of the
first SERVER_NEW_TOKENS positions of the reference prompts (those the float32 runner and server
match transformers on). Never an equality test: bf16 rounding moves near-ties."""

from __future__ import annotations

import pytest
import torch

from radixcluster.worker.model_runner import ModelRunner
from support.greedy_agreement import agreement, reference_runner
from support.paged_batches import Extend, PageBook


@pytest.fixture(scope="module")
def bf16_runner(model_path, hf_model) -> ModelRunner:
    return reference_runner(model_path, hf_model, torch.bfloat16)


def test_bf16_weights_and_cache_with_float32_logits(bf16_runner, prompts):
    assert {p.dtype for p in bf16_runner.model.parameters()} == {torch.bfloat16}
    assert bf16_runner.kv_pool.k[0].dtype == torch.bfloat16
    logits = bf16_runner.forward(PageBook(16, 256).batch([Extend(0, prompts[0], 0)]))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_bf16_greedy_agrees_with_fp32_on_95_percent_of_tokens(bf16_runner, prompts, fp32_greedy):
    share, tokens = agreement(bf16_runner, prompts, fp32_greedy)
    assert share >= 0.95, f"bf16 agrees with fp32 on {share:.1%} of {tokens} greedy tokens"
