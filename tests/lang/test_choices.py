"""SGLang's three ways for select to pick a choice, on logprob entries as the server gives them
([logprob, token id, text], the first of each choice without a logprob)."""

from __future__ import annotations

import pytest

import radixcluster.lang as sgl
from radixcluster.lang.choices import mean, scored


def entries(*logprobs: float | None) -> list[list]:
    return [[value, index, f"t{index}"] for index, value in enumerate(logprobs)]


def decide(method, inputs, unconditional=None):
    return method(
        choices=[f"c{i}" for i in range(len(inputs))],
        normalized_prompt_logprobs=[mean(scored(e)) for e in inputs],
        input_token_logprobs=inputs,
        output_token_logprobs=[[] for _ in inputs],
        unconditional_token_logprobs=unconditional,
    )


def test_token_length_normalized_takes_the_best_mean() -> None:
    inputs = [entries(None, -1.0, -3.0), entries(None, -1.0, -1.5, -1.5)]
    decision = decide(sgl.token_length_normalized, inputs)
    assert decision.decision == "c1" and decision.meta_info["normalized_prompt_logprobs"] == [
        -2.0,
        pytest.approx(-4 / 3),
    ]


def test_greedy_selection_decides_at_the_first_token_that_differs() -> None:
    # c0 wins the second token although its mean is far lower
    inputs = [entries(None, -1.0, -0.5, -9.0), entries(None, -1.0, -0.6, -0.1)]
    decision = decide(sgl.greedy_token_selection, inputs)
    assert decision.decision == "c0" and decide(sgl.token_length_normalized, inputs).decision == "c1"
    assert decision.meta_info["greedy_logprob_matrix"] == [[-1.0, -0.5, -9.0], [-1.0, -0.6, -0.1]]


def test_greedy_selection_continues_a_shorter_choice_at_its_mean_and_breaks_ties_first() -> None:
    inputs = [entries(None, -1.0, -2.0), entries(None, -1.0, -2.0, -1.0)]
    matrix = decide(sgl.greedy_token_selection, inputs).meta_info["greedy_logprob_matrix"]
    assert matrix[0] == [-1.0, -2.0, -1.5]
    assert decide(sgl.greedy_token_selection, inputs).decision == "c1"
    assert decide(sgl.greedy_token_selection, [entries(None, -1.0)] * 2).decision == "c0"


def test_unconditional_normalization_rewards_what_the_prompt_adds() -> None:
    # c0 is likely anywhere (-1 alone, -1 after the prompt); c1 only after the prompt
    inputs = [entries(None, -1.0, -1.0), entries(None, -1.0, -2.0)]
    alone = [entries(None, -1.0, -1.0), entries(None, -5.0, -6.0)]
    decision = decide(sgl.unconditional_likelihood_normalized, inputs, alone)
    assert decision.decision == "c1" and decision.meta_info["normalized_unconditional_prompt_logprobs"] == [0.0, 4.0]
    with pytest.raises(ValueError, match="unconditional token logprobs"):
        decide(sgl.unconditional_likelihood_normalized, inputs)


def test_select_takes_sglang_parameters_and_refuses_sampling() -> None:
    assert sgl.select("a", ["x", "y"], choices_method=sgl.greedy_token_selection).method is sgl.greedy_token_selection
    assert sgl.gen("a", choices=["x"], choices_method=sgl.greedy_token_selection).method is sgl.greedy_token_selection
    assert sgl.gen("a", choices=["x"]).method is sgl.token_length_normalized
    with pytest.raises(ValueError, match="temperature must be 0"):
        sgl.select("a", ["x"], temperature=0.7)
