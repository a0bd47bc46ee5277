"""A grammar held back while a reasoning model thinks (SGLang's require_reasoning): what the model
may write meanwhile, and the token where its answer, which the grammar holds, starts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import xgrammar as xgr

# what a token did to the gate: the model still thinks, the answer starts with the next token,
# or this token is already the answer's (the first token did not open the thinking)
Step = Literal["thinking", "after", "at"]


@dataclass(frozen=True)
class MarkerMasks:
    """Mask rows (xgrammar's layout: bit j of int32 word w is token 32 w + j) for a pair of
    markers, computed once per tokenizer from every token's text."""

    end: str
    # [k]: the tokens allowed once the output ends with k characters of ``end``: none that would
    # complete it and write on, since what a token writes after the marker would escape the grammar
    while_written: tuple[np.ndarray, ...]
    restricts: tuple[bool, ...]  # [k]: some token is left out at k
    opens: np.ndarray  # the tokens whose text opens the thinking (the start marker after whitespace)


def marker_masks(texts: Sequence[str], width: int, end: str, start: str | None) -> MarkerMasks:
    """``texts``: each token id's text (ids past them, a padded embedding's, write nothing)."""
    rows, restricts = [], []
    for k in range(len(end)):
        spills = np.zeros(width * 32, dtype=bool)
        for token, text in enumerate(texts):
            written = end[:k] + text
            at = written.find(end)
            spills[token] = at >= 0 and at + len(end) < len(written)
        rows.append(_bits(~spills))
        restricts.append(bool(spills.any()))
    opens = np.zeros(width * 32, dtype=bool)
    if start is not None:
        opens[: len(texts)] = [text.lstrip().startswith(start) for text in texts]
    return MarkerMasks(end, tuple(rows), tuple(restricts), _bits(opens))


def _bits(allowed: np.ndarray) -> np.ndarray:
    return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)


@dataclass(slots=True)
class ThinkingGate:
    """Where one request stands before its answer. The end marker is looked for in the text of the
    last tokens, so any tokens that spell it count, as long as none writes on past it."""

    masks: MarkerMasks
    decode: Callable[[list[int]], str]  # the text of a few ids, special tokens spelled
    # the first token decides whether the model thinks: it opens the thinking with the start
    # marker (a model that writes <think> itself), or it is the answer's, under the grammar
    opening: bool
    recent: list[int] = field(default_factory=list)
    written: int = 0  # characters of the end marker the output ends with

    @property
    def restricts(self) -> bool:
        """Whether the next token's row needs a mask."""
        return self.opening or self.masks.restricts[self.written]

    def fill(self, mask: np.ndarray, row: int, matcher: xgr.GrammarMatcher) -> None:
        if self.opening:
            # the answer's first token, or one that opens the thinking
            matcher.fill_next_token_bitmask(mask, row)
            mask[row] |= self.masks.opens
        else:
            mask[row] = self.masks.while_written[self.written]

    def step(self, token: int) -> Step:
        if self.opening:
            self.opening = False
            if not self.masks.opens[token // 32] >> (token % 32) & 1:
                return "at"
        end = self.masks.end
        # each token spells at least one byte of the (ASCII) marker, so its length in tokens is enough
        self.recent.append(token)
        del self.recent[: -len(end)]
        text = self.decode(self.recent)
        if end in text:
            return "after"
        self.written = next((k for k in range(len(end) - 1, 0, -1) if text.endswith(end[:k])), 0)
        return "thinking"
