"""Per-request streaming text: incremental detokenization and stop-string matching.

``IncrementalDetokenizer`` turns output token ids into text deltas whose concatenation
is exactly ``tokenizer.decode(all ids)``; ``StopChecker`` cuts that text at the first
stop string and never streams out a piece of one, in time and memory linear in the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from radixcluster.router.text.tokenizer import Tokenizer

INCOMPLETE = "\ufffd"  # what a partial UTF-8 sequence decodes to


class IncrementalDetokenizer:
    """Decodes a growing list of token ids a window at a time (the SGLang/vLLM scheme).

    ``prefix_offset:read_offset`` are the ids whose text was emitted last; each step
    decodes ``ids[prefix_offset:]`` and emits what it adds to that window's text, unless
    it ends in a partial character (held until the bytes complete, or until ``flush``).
    The window always starts where earlier text ended cleanly, so window decoding agrees
    with decoding everything, at O(window) per token. One exception: a SentencePiece
    byte-fallback vocabulary turns a whole run of byte tokens that is not valid UTF-8
    into replacement characters, after its valid head may have streamed; valid text (what
    models emit) streams exactly there too.
    """

    __slots__ = ("_tokenizer", "_skip_special", "ids", "prefix_offset", "read_offset")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, self._skip_special)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append new ids; the text they complete (possibly "")."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(INCOMPLETE):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """At the end of the request: whatever is still held, partial characters and all."""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text) :]


class StopChecker:
    """Finds the first stop string in streamed text in O(new text x stop strings) per delta.

    ``feed(delta, armed)`` returns ``(text to emit, stopped)``; while not ``armed`` (the request
    has fewer than its min_new_tokens) a stop string that completes is passed over, and one that
    began there and completes once armed still counts. The stop string that wins is the
    first to be complete in the text (on a tie, the one starting earliest), so the result
    does not depend on how the text was split into deltas. The emitted text ends before
    it, or after it with ``no_stop_trim``; nothing after it is ever emitted. While no stop
    string is complete, the longest tail that could begin one is held back, so a stop
    string split across deltas is never streamed out; ``flush`` releases it at the end.

    Each stop string runs a Knuth-Morris-Pratt matcher over the stream: its state is the
    longest prefix of the stop string that the text so far ends with, so the held tail is
    the largest state, and a state reaching the whole string is a match. Memory is linear
    in the stop strings, whatever their length.
    """

    __slots__ = ("stops", "no_stop_trim", "_fallbacks", "_states", "_held", "stopped", "matched")

    def __init__(self, stops: Sequence[str], no_stop_trim: bool = False) -> None:
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self.no_stop_trim = no_stop_trim
        self._fallbacks = [_fallback_table(stop) for stop in self.stops]
        self._states = [0] * len(self.stops)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str, armed: bool = True) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        text = self._held + delta
        for offset, char in enumerate(delta, start=len(self._held) + 1):
            stop = self._advance(char)
            if stop is not None and armed:
                self.stopped, self.matched, self._held = True, stop, ""
                return text[: offset if self.no_stop_trim else offset - len(stop)], True
        hold = max(self._states, default=0)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def end(self, stop: str) -> None:
        """Stopped on ``stop`` found outside the text fed (a special token the text skips)."""
        self.stopped, self.matched, self._held = True, stop, ""

    def flush(self) -> str:
        """The held tail, when the request ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _advance(self, char: str) -> str | None:
        """Move every matcher past ``char``; the longest stop string completed here, if any."""
        done = None
        for k, stop in enumerate(self.stops):
            state, fallback = self._states[k], self._fallbacks[k]
            while state and stop[state] != char:
                state = fallback[state - 1]
            if stop[state] == char:
                state += 1
            if state == len(stop):
                done = stop if done is None or len(stop) > len(done) else done
                state = fallback[state - 1]  # a match passed over: go on as KMP does
            self._states[k] = state
        return done


def _fallback_table(stop: str) -> list[int]:
    """KMP's failure function: ``table[i]`` is the longest proper prefix of ``stop[: i + 1]``
    that is also its suffix."""
    table = [0] * len(stop)
    state = 0
    for i in range(1, len(stop)):
        while state and stop[i] != stop[state]:
            state = table[state - 1]
        if stop[i] == stop[state]:
            state += 1
        table[i] = state
    return table
