"""Per-request streaming text: incremental detokenization and stop-string matching.

``IncrementalDetokenizer`` turns output token ids into text deltas whose concatenation
is exactly ``tokenizer.decode(all ids)``; ``StopChecker`` cuts that text at the first
stop string and never streams out a piece of one.
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

    __slots__ = ("_tokenizer", "_skip_special", "_spaces", "ids", "prefix_offset", "read_offset")

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._spaces = spaces_between_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, self._skip_special, self._spaces)

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
    """Finds the first stop string in streamed text, looking only at new text plus a short tail.

    ``feed(delta)`` returns ``(text to emit, stopped)``. The stop string that wins is the
    first to be complete in the text (on a tie, the one starting earliest), so the result
    does not depend on how the text was split into deltas. The emitted text ends before
    it, or after it with ``no_stop_trim``; nothing after it is ever emitted. While no stop
    string is complete, the longest tail that could begin one is held back, so a stop
    string split across deltas is never streamed out; ``flush`` releases it at the end.
    """

    __slots__ = ("stops", "no_stop_trim", "_prefixes", "_max_hold", "_held", "stopped", "matched")

    def __init__(self, stops: Sequence[str], no_stop_trim: bool = False) -> None:
        self.stops = tuple(s for s in dict.fromkeys(stops) if s)
        self.no_stop_trim = no_stop_trim
        self._prefixes = frozenset(stop[:i] for stop in self.stops for i in range(1, len(stop)))
        self._max_hold = max((len(stop) - 1 for stop in self.stops), default=0)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        # A stop string completed by `delta` started inside it or inside the held tail
        # (the held tail is the longest suffix that is a prefix of a stop string).
        text = self._held + delta
        hit = self._first_stop(text)
        if hit is not None:
            start, stop = hit
            self.stopped, self.matched, self._held = True, stop, ""
            return text[: start + len(stop) if self.no_stop_trim else start], True
        hold = self._holdback(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold], False

    def flush(self) -> str:
        """The held tail, when the request ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _first_stop(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None
        for stop in self.stops:
            start = text.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        return None if best is None else (best[1], best[2])

    def _holdback(self, text: str) -> int:
        for length in range(min(len(text), self._max_hold), 0, -1):
            if text[-length:] in self._prefixes:
                return length
        return 0
