"""Our Llama forward over the paged KV cache against transformers on SmolLM2 (float32):
whole prompts, prompts after a cached prefix, and mixed extend + decode batches; and the
native path that runs a few-row step's layers in one call against the layers one by one."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
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


def layer_by_layer(runner: ModelRunner, hf_model) -> ModelRunner:
    """A runner like ``runner`` whose layers run one by one (no ``decoder_layers``)."""
    plain = ModelRunner(runner.config, weights=hf_model.state_dict().items())
    for layer in plain.model.model.layers:
        attention = layer.self_attn.attention
        ops = dataclasses.replace(attention.layer_ops, decoder_layers=None)
        layer.self_attn.attention = dataclasses.replace(attention, layer_ops=ops)
    return plain


def written_kv(runner: ModelRunner, book: PageBook, lens: dict[int, int]) -> list[torch.Tensor]:
    """Every layer's K and V rows of the slots' first ``lens[slot]`` tokens."""
    page = runner.config.page_size
    rows = torch.tensor([book.pages[s][t // page] * page + t % page for s, n in lens.items() for t in range(n)])
    caches = (*runner.kv_pool.k, *runner.kv_pool.v)
    return [cache.view(-1, *cache.shape[2:])[rows] for cache in caches]


def test_few_row_steps_in_one_call_equal_the_layers_one_by_one(runner, prompts, hf_model) -> None:
    """With every linear product a native few-row one, a step's layers run in one native call
    (no Python between the kernels); it computes what the layers do one by one, bit for bit:
    the same logits and K/V for extends and decodes of one request, of several, and of a group
    sharing a prefix."""
    plain = layer_by_layer(runner, hf_model)
    most = runner.attention.layer_ops.matvec_rows
    assert runner.model._decoder_layers(1) is not None and runner.model._decoder_layers(most) is not None
    assert runner.model._decoder_layers(most + 1) is None and plain.model._decoder_layers(1) is None
    page = runner.config.page_size
    books = {r: PageBook(page, runner.config.num_pages, seed=3) for r in (runner, plain)}
    trunk = prompts[-1]
    shared = len(trunk) // page * page
    tails = {s: prompts[1][:s] + [s] for s in range(1, 5)}  # slot s: its own tokens after the trunk's pages
    steps = [
        [Extend(0, trunk, 0)],  # more rows than the few-row product takes: layer by layer
        [Extend(s, tail, shared) for s, tail in tails.items()],
        *(
            [Extend(0, [40 + i], len(trunk) + i)] + [Extend(s, [41 + i], shared + len(t) + i) for s, t in tails.items()]
            for i in range(3)
        ),
        [Extend(0, [99], len(trunk) + 3)],
    ]
    for index, step in enumerate(steps):
        logits = {}
        for r, book in books.items():
            if index == 1:
                for slot in tails:
                    book.share(0, slot, shared)
            batch = book.batch(step)
            groups = np.asarray([0 if slot in tails else -1 for slot in batch.slots], np.int32)
            if groups.max() == 0:  # slots 1-4 share the trunk's pages: one group
                batch = dataclasses.replace(
                    batch, prefix_groups=groups, prefix_group_lens=np.asarray([shared], np.int32)
                )
            logits[r] = r.forward(batch)
        assert torch.equal(logits[runner], logits[plain])
    lens = {0: len(trunk) + 4, **{s: shared + len(t) + 3 for s, t in tails.items()}}
    for ours, theirs in zip(written_kv(runner, books[runner], lens), written_kv(plain, books[plain], lens)):
        assert torch.equal(ours, theirs)


def test_missing_and_unknown_weights_are_named(model_path, hf_model) -> None:
    model = LlamaForCausalLM(load_model_config(model_path), TPGroup())
    weights = dict(hf_model.state_dict())
    del weights["model.layers.3.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"layers\.3\.mlp\.up_proj"):
        model.load_weights(weights.items())
    weights["model.layers.3.self_attn.o_proj.bias"] = torch.zeros(576)
    with pytest.raises(ValueError, match=r"o_proj\.bias"):
        model.load_weights(weights.items())
