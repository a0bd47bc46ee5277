"""The reference prompts as token ids, and float32's greedy continuations of them: what the
bf16 and fp8-cache runners are measured against."""

from __future__ import annotations

import pytest
import torch

from support.greedy_agreement import PROMPTS, greedy, reference_runner


@pytest.fixture(scope="session")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="session")
def fp32_greedy(model_path, hf_model, prompts) -> list[list[int]]:
    return greedy(reference_runner(model_path, hf_model, torch.float32), prompts)
