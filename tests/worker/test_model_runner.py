"""ModelRunner.step on SmolLM2: greedy continuations equal transformers' generate (on the default
CPU path, the native kernels, and on the torch reference), prompt logprobs equal its
log-softmax, the runner loads the GGUF itself through iter_weights, and --random-seed repeats its draws."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from radixcluster.protocol import StepResult, decode, encode
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from support.paged_batches import Extend, PageBook
from support.reference_prompts import RUNNER_NEW_TOKENS, RUNNER_PROMPTS

PROMPTS = RUNNER_PROMPTS


def runner_config(model_path, page_size: int = 16, attention_backend: str = "auto") -> RunnerConfig:
    return RunnerConfig(
        model_path=model_path,
        num_pages=512,
        page_size=page_size,
        max_slots=4,
        max_context_len=256,
        attention_backend=attention_backend,
    )


@pytest.fixture(scope="module")
def runner(model_path, hf_model) -> ModelRunner:
    return ModelRunner(runner_config(model_path), weights=hf_model.state_dict().items())


def test_the_default_cpu_path_is_the_native_kernels(runner) -> None:
    assert runner.attention.name == "native"


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_continuations_match_generate(runner, backend, model_path, hf_model, hf_tokenizer) -> None:
    if backend != "auto":
        runner = ModelRunner(
            runner_config(model_path, attention_backend=backend), weights=hf_model.state_dict().items()
        )
        assert runner.attention.name == backend
    prompts = [hf_tokenizer(text)["input_ids"] for text in PROMPTS]
    book = PageBook(runner.config.page_size, runner.config.num_pages)
    # frames cross a real encode/decode, as they do between router and worker
    result = runner.step(decode(encode(book.batch([Extend(slot, p, 0) for slot, p in enumerate(prompts)]))))
    outputs = [[int(t)] for t in result.next_token_ids]
    for _ in range(RUNNER_NEW_TOKENS - 1):
        batch = [Extend(slot, [out[-1]], len(p) + len(out) - 1) for slot, (p, out) in enumerate(zip(prompts, outputs))]
        result = runner.step(decode(encode(book.batch(batch))))
        for out, token in zip(outputs, result.next_token_ids):
            out.append(int(token))
    for prompt, ours in zip(prompts, outputs):
        expected = hf_model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=RUNNER_NEW_TOKENS, min_new_tokens=RUNNER_NEW_TOKENS
        )
        assert ours == expected[0, len(prompt) :].tolist()


def test_step_result_types(runner, hf_tokenizer) -> None:
    book = PageBook(runner.config.page_size, runner.config.num_pages)
    batch = book.batch([Extend(0, hf_tokenizer(PROMPTS[0])["input_ids"], 0), Extend(1, [5, 6, 7], 0)])
    batch.sampling.return_logprob = True
    batch.sampling.top_logprobs_num[:] = [3, 1]
    result = runner.step(batch)
    assert isinstance(result, StepResult) and result.step_id == batch.step_id
    assert result.next_token_ids.dtype == np.int32 and result.next_token_ids.shape == (2,)
    assert result.logprobs.dtype == np.float32 and np.all(result.logprobs <= 0)
    assert result.top_logprob_ids.dtype == np.int32 and result.top_logprob_ids.shape == (2, 3)
    assert np.array_equal(result.top_logprob_ids[:, 0], result.next_token_ids)
    assert result.input_logprobs is None
    decode(encode(result))


def test_input_logprobs_match_transformers(runner, hf_model, hf_tokenizer) -> None:
    prompt = hf_tokenizer(PROMPTS[1])["input_ids"]
    with torch.inference_mode():
        full = torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0], dim=-1)
    expected = full[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    book = PageBook(runner.config.page_size, runner.config.num_pages)
    cut = 5
    # chunk 1 asks from its token 2 on, and (told the next chunk's first token) at its last
    # token too; chunk 2 (after a cached prefix) asks from its start; a decode in the same batch
    # asks nothing
    chunk = Extend(0, prompt[:cut], 0, logprob_start=2, logprob_next_id=prompt[cut])
    first = runner.step(book.batch([chunk, Extend(1, [9], 0)]))
    second = runner.step(book.batch([Extend(1, [10], 1), Extend(0, prompt[cut:], cut, logprob_start=0)]))
    torch.testing.assert_close(torch.from_numpy(first.input_logprobs), expected[2:cut], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_numpy(second.input_logprobs), expected[cut:], rtol=1e-4, atol=1e-4)


def test_runner_loads_the_gguf_through_iter_weights(runner, model_path, hf_tokenizer) -> None:
    own = ModelRunner(runner_config(model_path))
    prompt = hf_tokenizer(PROMPTS[0])["input_ids"]
    ours = own.forward(PageBook(16, 512).batch([Extend(0, prompt, 0)]))
    ref = runner.forward(PageBook(16, 512).batch([Extend(0, prompt, 0)]))
    assert float((ours - ref).norm() / ref.norm()) < 1e-4


def test_the_random_seed_repeats_the_draws_of_requests_without_a_seed(model_path, hf_model, hf_tokenizer) -> None:
    """--random-seed: a runner seeded alike draws the same tokens, step after step; another
    seed draws others."""
    prompts = [hf_tokenizer(text)["input_ids"] for text in PROMPTS]

    def draws(seed: int) -> list[list[int]]:
        config = dataclasses.replace(runner_config(model_path), random_seed=seed)
        seeded = ModelRunner(config, weights=hf_model.state_dict().items())
        batch = PageBook(config.page_size, config.num_pages).batch([Extend(s, p, 0) for s, p in enumerate(prompts)])
        batch.sampling.temperature[:] = 1.5
        return [seeded.step(batch).next_token_ids.tolist() for _ in range(4)]

    first = draws(7)
    assert len({tuple(step) for step in first}) > 1  # the generator moves on between steps
    assert draws(7) == first and draws(8) != first
