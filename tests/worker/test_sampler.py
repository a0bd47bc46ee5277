"""The sampler on fixed logit vectors: greedy, seeds, filters, penalties, vocab mask, logprobs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.protocol import FLOAT32_MAX, SamplingBatch, decode, encode
from radixcluster.worker.sampler import MASKED_LOGPROB, apply_logit_bias, apply_penalties, argmax_rows, sample

# probabilities 0.4, 0.3, 0.15, 0.1, 0.05: filter boundaries are far from float rounding
FIVE = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]).log()


def batch(
    size: int,
    penalties: list[list[int]] | None = None,
    return_logprob: bool = False,
    biases: list[dict[int, float]] | None = None,
    prompt_penalties: list[list[int]] | None = None,
    **fields,
) -> SamplingBatch:
    """A SamplingBatch of ``size`` rows with neutral defaults; a field given as a scalar is
    broadcast, as a list taken per row."""
    defaults = {
        "temperature": (1.0, np.float32),
        "top_p": (1.0, np.float32),
        "top_k": (-1, np.int32),
        "min_p": (0.0, np.float32),
        "frequency_penalty": (0.0, np.float32),
        "presence_penalty": (0.0, np.float32),
        "repetition_penalty": (1.0, np.float32),
        "seed": (-1, np.int64),
        "top_logprobs_num": (0, np.int32),
    }
    arrays = {
        name: np.broadcast_to(np.asarray(fields.get(name, default), dtype=dtype), (size,)).copy()
        for name, (default, dtype) in defaults.items()
    }
    penalties = penalties or [[] for _ in range(size)]
    prompt_penalties = prompt_penalties or [[] for _ in range(size)]
    biases = biases or [{} for _ in range(size)]
    return SamplingBatch(
        **arrays,
        penalty_ids=np.array([t for ids in penalties for t in ids], dtype=np.int32),
        penalty_lens=np.array([len(ids) for ids in penalties], dtype=np.int32),
        prompt_penalty_ids=np.array([t for ids in prompt_penalties for t in ids], dtype=np.int32),
        prompt_penalty_lens=np.array([len(ids) for ids in prompt_penalties], dtype=np.int32),
        bias_ids=np.array([t for b in biases for t in b], dtype=np.int32),
        bias_values=np.array([v for b in biases for v in b.values()], dtype=np.float32),
        bias_lens=np.array([len(b) for b in biases], dtype=np.int32),
        return_logprob=return_logprob,
    )


def positions(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def draws(logits: torch.Tensor, n: int, **fields) -> np.ndarray:
    """``n`` seeded draws (seeds 0..n-1) from one logit row, in one batch."""
    out = sample(logits.expand(n, -1), batch(n, seed=np.arange(n), **fields), torch.zeros(n, dtype=torch.int64), None)
    return out.next_token_ids.numpy()


def test_temperature_zero_is_argmax():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0))
    out = sample(logits, batch(6, temperature=0.0), positions(*range(6)), None)
    assert torch.equal(out.next_token_ids, logits.argmax(-1))
    assert out.logprobs is None and out.top_logprob_ids is None and out.top_logprob_values is None


def test_top_k_one_is_greedy_even_when_seeded():
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(1))
    out = sample(logits, batch(6, temperature=1.5, top_k=1, seed=[-1, 3, 4, -1, 5, 6]), positions(*range(6)), None)
    assert torch.equal(out.next_token_ids, logits.argmax(-1))


def test_seeded_row_gives_same_token_in_any_batch():
    gen = torch.Generator().manual_seed(2)
    row = torch.randn(1, 500, generator=gen)
    for seed, position in [(0, 0), (1234, 7), (2**62, 99)]:
        alone = sample(row, batch(1, seed=seed), positions(position), None).next_token_ids[0]
        others = torch.randn(4, 500, generator=gen)
        mixed = torch.cat([others[:2], row, others[2:]])
        params = batch(5, seed=[-1, 11, seed, -1, 12], temperature=[0.0, 0.7, 1.0, 1.3, 1.0], top_k=[-1, 50, -1, -1, 5])
        in_batch = sample(mixed, params, positions(3, 8, position, 0, 1), None).next_token_ids[2]
        assert alone == in_batch
        assert alone == sample(row, batch(1, seed=seed), positions(position), None).next_token_ids[0]


def test_different_seeds_and_positions_draw_differently():
    flat = torch.zeros(1, 1000)
    by_seed = draws(flat, 200)
    assert len(set(by_seed.tolist())) > 150
    by_position = sample(flat.expand(200, -1), batch(200, seed=42), torch.arange(200), None).next_token_ids
    assert len(set(by_position.tolist())) > 150


@pytest.mark.parametrize(
    ("fields", "allowed"),
    [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.6}, {0, 1}),
        ({"top_p": 0.0}, {0}),  # the most likely token always stays
        ({"top_p": 0.75}, {0, 1, 2}),
        ({"min_p": 0.3}, {0, 1, 2}),
        ({"min_p": 0.5}, {0, 1}),
        # top_p counts the mass renormalized over the top_k survivors: 0.4/0.85 + 0.3/0.85 > 0.8
        ({"top_k": 3, "top_p": 0.8}, {0, 1}),
        ({"top_k": 4, "min_p": 0.2}, {0, 1, 2, 3}),
        ({"temperature": 0.5, "top_p": 0.85}, {0, 1}),  # squared: 0.56 + 0.32 > 0.85
        ({"temperature": 0.5, "top_p": 0.9}, {0, 1, 2}),
    ],
)
def test_filters_keep_exactly_the_allowed_set(fields: dict, allowed: set[int]):
    assert set(draws(FIVE.unsqueeze(0), 2000, **fields).tolist()) == allowed


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, [0.4, 0.3, 0.15, 0.1, 0.05]),
        ({"top_k": 3}, [0.4 / 0.85, 0.3 / 0.85, 0.15 / 0.85, 0.0, 0.0]),
        # temperature 0.5 squares the probabilities
        ({"temperature": 0.5}, [p * p / 0.285 for p in (0.4, 0.3, 0.15, 0.1, 0.05)]),
    ],
)
def test_draw_frequencies_follow_the_distribution(fields: dict, expected: list[float]):
    n = 4000
    freq = np.bincount(draws(FIVE.unsqueeze(0), n, **fields), minlength=5) / n
    assert np.allclose(freq, expected, atol=0.035), freq


def test_unseeded_rows_use_the_global_generator():
    torch.manual_seed(7)
    first = sample(FIVE.expand(300, -1), batch(300), torch.zeros(300, dtype=torch.int64), None).next_token_ids
    torch.manual_seed(7)
    again = sample(FIVE.expand(300, -1), batch(300), torch.zeros(300, dtype=torch.int64), None).next_token_ids
    assert torch.equal(first, again)
    assert set(first.tolist()) == {0, 1, 2, 3, 4}


def test_penalties_match_hand_computed_logits():
    logits = torch.tensor(
        [
            [2.0, 1.8, -1.0, 0.5],  # repetition 1.5 on {0, 2}: 2/1.5, -1*1.5
            [3.0, 2.0, 0.0, 0.0],  # frequency 0.4 on 0,0,0: 3 - 1.2
            [3.0, 2.5, 1.0, 0.0],  # presence 0.6 on 0,0,2: 3 - 0.6, 1 - 0.6
            [1.0, 2.0, 3.0, 4.0],  # ids but neutral parameters: unchanged
            [1.0, 2.0, 3.0, 4.0],  # no ids: unchanged
        ]
    )
    penalties = {
        "penalties": [[0, 2, 0], [0, 0, 0], [0, 0, 2], [3, 3], []],
        "repetition_penalty": [1.5, 1.0, 1.0, 1.0, 2.0],
        "frequency_penalty": [0.0, 0.4, 0.0, 0.0, 1.0],
        "presence_penalty": [0.0, 0.0, 0.6, 0.0, 1.0],
    }
    expected = torch.tensor(
        [
            [2.0 / 1.5, 1.8, -1.5, 0.5],
            [1.8, 2.0, 0.0, 0.0],
            [2.4, 2.5, 0.4, 0.0],
            [1.0, 2.0, 3.0, 4.0],
            [1.0, 2.0, 3.0, 4.0],
        ]
    )
    assert torch.allclose(apply_penalties(logits, batch(5, **penalties)), expected)
    greedy = sample(logits, batch(5, temperature=0.0, **penalties), positions(*range(5)), None)
    assert greedy.next_token_ids.tolist() == [1, 1, 1, 3, 3]
    assert logits[0, 0] == 2.0, "the caller's logits are never modified"


def test_the_repetition_penalty_covers_the_prompt_and_the_others_do_not():
    logits = torch.tensor([[2.0, 1.8, -1.0, 0.5], [2.0, 1.8, -1.0, 0.5], [2.0, 1.8, -1.0, 0.5]])
    params = batch(
        3,
        temperature=0.0,
        prompt_penalties=[[0, 2], [0], [0]],  # distinct prompt tokens
        penalties=[[], [2, 2], [3]],  # output tokens
        repetition_penalty=[1.5, 2.0, 1.0],
        frequency_penalty=[0.0, 0.0, 0.5],
    )
    expected = torch.tensor(
        [
            [2.0 / 1.5, 1.8, -1.5, 0.5],  # before any output: the prompt's tokens
            [1.0, 1.8, -2.0, 0.5],  # prompt and output, each token once
            [2.0, 1.8, -1.0, 0.0],  # frequency: the output's token 3 only, not the prompt's 0
        ]
    )
    assert torch.allclose(apply_penalties(logits, params), expected)
    assert sample(logits, params, positions(0, 0, 0), None).next_token_ids.tolist() == [1, 1, 0]


def test_penalties_that_do_not_flip_the_argmax():
    logits = torch.tensor([[3.0, 2.0], [3.0, 2.5], [-1.0, -1.2]])
    params = batch(
        3,
        temperature=0.0,
        penalties=[[0, 0], [0, 0, 0, 0], [1]],
        frequency_penalty=[0.4, 0.0, 0.0],  # 3 - 0.8 = 2.2 > 2
        presence_penalty=[0.0, 0.4, 0.0],  # once, whatever the count: 2.6 > 2.5
        repetition_penalty=[1.0, 1.0, 1.2],  # -1.2 * 1.2 = -1.44 < -1
    )
    assert sample(logits, params, positions(0, 0, 0), None).next_token_ids.tolist() == [0, 0, 0]


def test_logit_biases_are_added_to_their_rows_before_the_penalties():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0], [2.0, 1.0, 0.0, -1.0]])
    params = batch(
        3,
        temperature=0.0,
        biases=[{3: 100.0}, {}, {0: -100.0, 2: 0.5}],
        penalties=[[], [], [1]],
        frequency_penalty=[0.0, 0.0, 1.0],  # row 2: token 1 drops to 0, below token 2's 0.5
    )
    params = decode(encode(params))  # as the worker receives them: read-only arrays
    expected = torch.tensor([[2.0, 1.0, 0.0, 99.0], [2.0, 1.0, 0.0, -1.0], [-98.0, 1.0, 0.5, -1.0]])
    assert torch.equal(apply_logit_bias(logits, params), expected)
    out = sample(logits, params, positions(0, 0, 0), None)
    assert out.next_token_ids.tolist() == [3, 0, 2]
    assert logits[0, 3] == -1.0, "the caller's logits are never modified"
    # a sampled row draws from the biased distribution: a token banned by -100 is never drawn
    banned = draws(FIVE, 200, temperature=1.0, biases=[{0: -100.0}] * 200)
    assert 0 not in set(banned.tolist()) and len(set(banned.tolist())) == 4


def pack_mask(allowed: list[set[int]], vocab: int) -> torch.Tensor:
    """xgrammar's bitmask layout: bit j of int32 word w allows token 32*w + j."""
    words = -(-vocab // 32)
    bits = np.zeros((len(allowed), words * 32), dtype=np.uint64)
    for row, tokens in enumerate(allowed):
        bits[row, list(tokens)] = 1
    packed = (bits.reshape(len(allowed), words, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32))


def test_vocab_mask_forces_the_lowest_logit():
    vocab = 70  # three words, the last one partly used
    logits = torch.arange(vocab, dtype=torch.float32).expand(4, -1).contiguous()
    mask = pack_mask([{0}, {31}, {0, 63}, set(range(vocab))], vocab)
    mask[3] = -1  # all bits set: unconstrained
    greedy = sample(logits, batch(4, temperature=0.0), positions(0, 0, 0, 0), mask).next_token_ids
    assert greedy.tolist() == [0, 31, 63, 69]
    sampled = sample(logits, batch(4, seed=[1, 2, 3, 4], temperature=5.0), positions(0, 0, 0, 0), mask).next_token_ids
    assert sampled[0] == 0 and sampled[1] == 31 and sampled[2] in (0, 63)


def test_extreme_temperatures_sample_their_limits():
    """Near 0 a temperature is greedy (the logits divided first would overflow to inf, and
    inf - inf is nan); at float32's largest the draw is uniform over the tokens a mask allows,
    never a masked one (-inf / inf would be nan)."""
    logits = torch.randn(64, 500, generator=torch.Generator().manual_seed(5)) * 20
    tiny = draws(logits[:1], 64, temperature=1e-45)  # float32's smallest subnormal
    assert set(tiny.tolist()) == {int(logits[0].argmax())}
    allowed = {3, 77, 140, 499}
    mask = pack_mask([allowed] * 64, 500)
    huge = batch(64, seed=np.arange(64), temperature=FLOAT32_MAX)
    drawn = sample(logits[:1].expand(64, -1), huge, torch.zeros(64, dtype=torch.int64), mask).next_token_ids
    assert set(drawn.tolist()) == allowed  # every allowed token, a 20-logit gap notwithstanding


def test_a_repetition_penalty_near_zero_favours_the_seen_tokens_without_overflowing():
    """A positive logit divided by a penalty of 1e-45 would be inf, and the draw's softmax nan
    (token 0); the seen tokens with positive logits tie at float32's largest instead."""
    logits = torch.randn(32, 200, generator=torch.Generator().manual_seed(6))
    seen = [5, 17, 42, 99]
    positive = {t for t in seen if logits[0, t] > 0}
    assert positive and positive != set(seen)  # the seed gives both kinds
    for temperature in (0.0, 1.0):
        params = batch(32, [seen] * 32, seed=np.arange(32), temperature=temperature, repetition_penalty=1e-45)
        drawn = sample(logits[:1].expand(32, -1), params, torch.zeros(32, dtype=torch.int64), None).next_token_ids
        assert set(drawn.tolist()) <= positive and (temperature == 0 or len(set(drawn.tolist())) > 1)


def test_logprobs_are_those_the_mask_allows_before_biases_penalties_and_temperature():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(3))
    mask = pack_mask([{5, 7}, set(range(50)), set(range(50))], 50)
    params = batch(
        3,
        temperature=[0.0, 0.8, 0.0],
        seed=[-1, 9, -1],
        top_logprobs_num=[3, 5, 0],
        penalties=[[], [], [int(logits[2].argmax())]],
        repetition_penalty=3.0,
        return_logprob=True,
    )
    # as the worker receives them: read-only arrays decoded from a frame
    out = sample(logits, decode(encode(params)), positions(4, 4, 4), mask)
    raw = torch.log_softmax(logits, dim=-1)
    # the masked row: a distribution over tokens 5 and 7 only (as SGLang and vLLM give it)
    allowed = torch.log_softmax(logits[0, [5, 7]], dim=-1)
    assert out.next_token_ids[0] == (5 if allowed[0] > allowed[1] else 7)
    assert sorted(out.top_logprob_ids[0, :2].tolist()) == [5, 7]
    assert torch.allclose(
        out.top_logprob_values[0, :2].sort(descending=True).values, allowed.sort(descending=True).values
    )
    assert out.top_logprob_values[0, 2] == MASKED_LOGPROB  # forbidden: a finite number JSON can hold
    assert torch.allclose(out.logprobs[1:], raw[1:].gather(1, out.next_token_ids[1:].unsqueeze(1)).squeeze(1))
    values, ids = torch.topk(raw[1:], 5, dim=-1)
    assert torch.equal(out.top_logprob_ids[1:], ids) and torch.allclose(out.top_logprob_values[1:], values)
    assert out.top_logprob_ids.dtype == torch.int64 and out.logprobs.dtype == torch.float32


def test_top_logprobs_without_chosen_logprob():
    logits = torch.randn(2, 20, generator=torch.Generator().manual_seed(4))
    out = sample(logits, batch(2, temperature=0.0, top_logprobs_num=[0, 3]), positions(0, 0), None)
    assert out.logprobs is None and out.top_logprob_ids.shape == (2, 3)


def test_greedy_rows_ignore_sampled_rows_in_the_batch():
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(5))
    temperature = [0.0, 1.0, 0.0, 2.0, 0.0, 0.9, 0.0, 1.0]
    out = sample(logits, batch(8, temperature=temperature, top_p=0.5, min_p=0.1), torch.arange(8), None)
    greedy = [i for i, t in enumerate(temperature) if t == 0.0]
    assert torch.equal(out.next_token_ids[greedy], logits[greedy].argmax(-1))


def reference_allowed(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens the filters may keep, computed naively in float64; every boundary is widened
    by a relative 1e-4 so float32 rounding and ties at a cut never fail the check."""
    eps = 1e-4
    weights = [math.exp((x - max(logits)) / temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]
    ranked = sorted(probs, reverse=True)
    k = top_k if 0 < top_k < len(probs) else len(probs)
    mass = sum(ranked[:k])
    last = max(r for r in range(k) if r == 0 or top_p >= 1 or sum(ranked[:r]) < (top_p + eps) * mass)
    floor = max(ranked[last], min_p * ranked[0]) * (1 - eps)
    return {i for i, p in enumerate(probs) if p >= floor}


@settings(max_examples=150, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8, allow_nan=False, width=32), min_size=2, max_size=40),
    temperature=st.floats(0.05, 3.0),
    top_k=st.integers(-1, 45),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**40),
)
def test_sampled_token_is_within_the_filtered_set(logits, temperature, top_k, top_p, min_p, seed):
    n = 16
    params = batch(n, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed + np.arange(n))
    row = torch.tensor(logits, dtype=torch.float32)
    tokens = sample(row.expand(n, -1), params, torch.arange(n), None).next_token_ids.tolist()
    allowed = reference_allowed(
        row.tolist(), float(np.float32(temperature)), top_k, float(np.float32(top_p)), float(np.float32(min_p))
    )
    assert set(tokens) <= allowed


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.sampled_from([5, 64, 192, 512, 1000, 1536, 49152]),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["ties", "normal", "inf", "nan"]),
)
def test_argmax_rows_is_torch_argmax(rows, width, seed, kind):
    generator = torch.Generator().manual_seed(seed)
    if kind == "ties":  # few distinct values: many tied maxima, across and within blocks
        x = torch.randint(0, 3, (rows, width), generator=generator).float()
    else:
        x = torch.randn(rows, width, generator=generator)
    if kind in ("inf", "nan"):
        special = torch.rand(rows, width, generator=generator) < 0.01
        x[special] = float("-inf") if kind == "inf" else float("nan")
        x[0] = float("-inf")  # a row with nothing allowed picks token 0
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
