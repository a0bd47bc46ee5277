"""How ``select`` picks one of its choices from their logprobs: SGLang's three methods under
its names, so that a program passing ``choices_method=sgl.greedy_token_selection`` runs here.

Each method gets, per choice, the server's ``input_token_logprobs`` entries ([logprob, token
id, text]) from the prefix's second-to-last token on, the first of them without a logprob
(it starts the scored range), as ``select`` asks for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Entries = list[list[Any]]


@dataclass(slots=True, frozen=True)
class ChoicesDecision:
    decision: str
    meta_info: dict[str, Any]


class ChoicesSamplingMethod:
    """A rule that picks a choice (SGLang's call signature); ``requires_unconditional_logprobs``:
    it also needs each choice's tokens scored alone, without the prompt (one more request)."""

    requires_unconditional_logprobs = False

    def __call__(
        self,
        *,
        choices: list[str],
        normalized_prompt_logprobs: list[float],
        input_token_logprobs: list[Entries],
        output_token_logprobs: list[Entries],
        unconditional_token_logprobs: list[Entries] | None = None,
    ) -> ChoicesDecision:
        best, found = self.pick(normalized_prompt_logprobs, input_token_logprobs, unconditional_token_logprobs)
        meta = {
            "normalized_prompt_logprobs": normalized_prompt_logprobs,
            "input_token_logprobs": input_token_logprobs,
            "output_token_logprobs": output_token_logprobs,
        }
        return ChoicesDecision(choices[best], meta | found)

    def pick(
        self, normalized: list[float], inputs: list[Entries], unconditional: list[Entries] | None
    ) -> tuple[int, dict[str, Any]]:
        """The index of the choice picked, and what the rule found, for the meta info."""
        raise NotImplementedError


def scored(entries: Entries) -> list[float]:
    """The logprobs of the entries that have one."""
    return [entry[0] for entry in entries if entry[0] is not None]


def mean(values: list[float]) -> float:
    # only a choice merged into a one-token prompt has no scored token: it cannot be ranked
    return sum(values) / len(values) if values else float("-inf")


def _best(scores: list[float]) -> int:
    return max(range(len(scores)), key=scores.__getitem__)


class TokenLengthNormalized(ChoicesSamplingMethod):
    """The highest mean logprob per token (SGLang's default)."""

    def pick(
        self, normalized: list[float], inputs: list[Entries], unconditional: list[Entries] | None
    ) -> tuple[int, dict[str, Any]]:
        return _best(normalized), {}


class GreedyTokenSelection(ChoicesSamplingMethod):
    """Token by token, keep the choices whose logprob at that token is the highest, until one is
    left (the first of a tie after the last token). A shorter choice continues at its mean
    logprob, so that a choice that is a prefix of a longer one competes with it."""

    def pick(
        self, normalized: list[float], inputs: list[Entries], unconditional: list[Entries] | None
    ) -> tuple[int, dict[str, Any]]:
        rows = [scored(entries) for entries in inputs]
        width = max(len(row) for row in rows)
        matrix = [row + [mean(row)] * (width - len(row)) for row in rows]
        remaining = list(range(len(rows)))
        for column in range(width):
            top = max(matrix[i][column] for i in remaining)
            remaining = [i for i in remaining if matrix[i][column] == top]
            if len(remaining) == 1:
                break
        return remaining[0], {"greedy_logprob_matrix": matrix}


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    """The highest mean of (logprob after the prompt - logprob of the same tokens alone): what
    the prompt adds to each choice, so that choices likely anywhere do not win by that alone.
    A token without an unconditional logprob (the first alone) counts 0 there."""

    requires_unconditional_logprobs = True

    def pick(
        self, normalized: list[float], inputs: list[Entries], unconditional: list[Entries] | None
    ) -> tuple[int, dict[str, Any]]:
        if unconditional is None:
            raise ValueError("unconditional_likelihood_normalized needs the choices' unconditional token logprobs")
        gains = [
            mean(
                [given[0] - (alone[0] or 0.0) for given, alone in zip(row, alones, strict=True) if given[0] is not None]
            )
            for row, alones in zip(inputs, unconditional, strict=True)
        ]
        found = {"unconditional_token_logprobs": unconditional, "normalized_unconditional_prompt_logprobs": gains}
        return _best(gains), found


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()
