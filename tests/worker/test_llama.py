"""Our Llama forward over the paged KV cache against transformers on SmolLM2 (float32):
whole prompts, prompts after a cached prefix, and mixed extend + decode batches."""

from __future__ import annotations

import functools

import pytest
import torch

from radixcluster.model_config import load_model_config
from radixcluster.worker.llama import LlamaForCausalLM
from radixcluster.worker.model_runner import ModelRunner, RunnerConfig
from radixcluster.worker.parallel import TPGroup
from support.paged_batches import Extend, PageBook

TEXTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Radix trees share prefixes. " * 12 + "A radix tree is",
]


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).norm() / ref.norm())


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer(text)["input_ids"] for text in TEXTS]


@pytest.fixture(scope="module")
def reference(hf_model):
    """transformers' last-token logits of a token sequence."""

    @functools.cache
    def logits(tokens: tuple[int, ...]) -> torch.Tensor:
        with torch.inference_mode():
            return hf_model(torch.tensor([tokens])).logits[0, -1]

    return lambda tokens: logits(tuple(tokens))


@pytest.fixture(scope="module", params=[1, 16], ids=["page1", "page16"])
def runner(request, model_path, hf_model) -> ModelRunner:
    config = RunnerConfig(
        model_path=model_path,
        num_pages=4096 // request.param,
        page_size=request.param,
        max_slots=16,
        max_context_len=512,
    )
    return ModelRunner(config, weights=hf_model.state_dict().items())


def test_prefill_logits_match_transformers(runner, prompts, reference) -> None:
    assert len({len(p) for p in prompts}) == len(prompts)
    book = PageBook(runner.config.page_size, runner.config.num_pages)
    logits = runner.forward(book.batch([Extend(slot, p, 0) for slot, p in enumerate(prompts)]))
    assert logits.shape == (len(prompts), runner.model_config.vocab_size) and logits.dtype == torch.float32
    for row, prompt in zip(logits, prompts):
        assert rel_err(row, reference(prompt)) < 1e-4


def test_extend_after_cached_prefix_of_same_slot(runner, prompts, reference) -> None:
    """Chunked prefill: the second chunk starts on or inside a page."""
    prompt = prompts[-1]
    for slot, cut in enumerate([1, 15, 16, 17, 32, 45]):
        book = PageBook(runner.config.page_size, runner.config.num_pages, seed=slot)
        first = runner.forward(book.batch([Extend(slot, prompt[:cut], 0)]))
        assert rel_err(first[0], reference(prompt[:cut])) < 1e-4
        rest = runner.forward(book.batch([Extend(slot, prompt[cut:], cut)]))
        assert rel_err(rest[0], reference(prompt)) < 1e-4


def test_extend_after_prefix_shared_from_another_slot(runner, prompts, reference) -> None:
    """A radix-cache hit: the new request's table starts with another request's pages."""
    page = runner.config.page_size
    book = PageBook(page, runner.config.num_pages)
    trunk = prompts[-1]
    runner.forward(book.batch([Extend(0, trunk, 0)]))
    for slot, shared in enumerate([page, 2 * page, 3 * page], start=1):
        tail = prompts[1][1:] + [slot]
        book.share(0, slot, shared)
        logits = runner.forward(book.batch([Extend(slot, tail, shared)]))
        assert rel_err(logits[0], reference(trunk[:shared] + tail)) < 1e-4


def test_mixed_batch_equals_each_request_alone(runner, prompts, reference) -> None:
    a, b, c, d = prompts
    mixed = PageBook(runner.config.page_size, runner.config.num_pages, seed=1)
    runner.forward(mixed.batch([Extend(0, a, 0), Extend(1, b, 0)]))
    batch = [
        Extend(2, c[:20], 0),
        Extend(0, [42], len(a)),
        Extend(3, d, 0),
        Extend(1, [7], len(b)),
        Extend(4, c[:9], 0),
    ]
    together = runner.forward(mixed.batch(batch))

    alone = PageBook(runner.config.page_size, runner.config.num_pages, seed=2)
    slots = {0: 8, 1: 9, 2: 10, 3: 11, 4: 12}
    runner.forward(alone.batch([Extend(8, a, 0)]))
    runner.forward(alone.batch([Extend(9, b, 0)]))
    for row, req in zip(together, batch):
        single = runner.forward(alone.batch([Extend(slots[req.slot], req.token_ids, req.prefix_len)]))
        # a batch's size picks the GEMM kernel (packed oneDNN or MKL): equal up to float rounding
        assert rel_err(row, single[0]) < 1e-4
    assert rel_err(together[1], reference(a + [42])) < 1e-4
    assert rel_err(together[3], reference(b + [7])) < 1e-4


def test_missing_and_unknown_weights_are_named(model_path, hf_model) -> None:
    model = LlamaForCausalLM(load_model_config(model_path), TPGroup())
    weights = dict(hf_model.state_dict())
    del weights["model.layers.3.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"layers\.3\.mlp\.up_proj"):
        model.load_weights(weights.items())
    weights["model.layers.3.self_attn.o_proj.bias"] = torch.zeros(576)
    with pytest.raises(ValueError, match=r"o_proj\.bias"):
        model.load_weights(weights.items())
