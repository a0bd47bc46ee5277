"""SGLang's ``stop_regex``: end a request's streamed text at the first match of any pattern.

Unlike a stop string, the match stays in the text (SGLang does not trim it either), and
nothing is held back while streaming: a pattern can match text of any length, so no tail
can be known to be free of a future match.

Patterns run on the ``regex`` engine (``re``'s syntax) because its searches can time out: a
pattern that backtracks catastrophically, such as ``(x|xx)+y``, on a text the client steered
the model into would otherwise hold the router's loop for ever.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

# how long one search of one pattern may take before its request is ended (400)
SEARCH_TIMEOUT_S = 0.05


class StopRegexTimeout(Exception):
    """A stop_regex search ran past SEARCH_TIMEOUT_S; the message is for the client."""


class RegexStopChecker:
    """``feed(delta, armed)`` returns ``(text to emit, stopped)``. The text searched is everything
    fed so far, so a match that spans deltas is found; the winner is the match that ends first
    (on a tie, the pattern listed first), and the emitted text ends where it ends. A match must
    end in text fed once ``armed`` (the request has its min_new_tokens)."""

    __slots__ = ("patterns", "text", "unarmed", "stopped", "matched")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [regex.compile(p) for p in dict.fromkeys(patterns)]
        self.text = ""
        self.unarmed = 0  # characters fed before it was armed: no match may end within them
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str, armed: bool = True) -> tuple[str, bool]:
        """StopRegexTimeout when a search takes longer than SEARCH_TIMEOUT_S."""
        if self.stopped or not self.patterns:
            return ("", True) if self.stopped else (delta, False)
        emitted = len(self.text)
        self.text += delta
        if not armed:
            self.unarmed = len(self.text)
            return delta, False
        hits = [(m.end(), i) for i, p in enumerate(self.patterns) if (m := self._first_armed(p)) is not None]
        if not hits:
            return delta, False
        end, index = min(hits)
        self.stopped, self.matched = True, self.patterns[index].pattern
        return self.text[emitted : max(end, emitted)], True

    def _first_armed(self, pattern: regex.Pattern) -> regex.Match | None:
        """The first match that ends past the text fed before it was armed."""
        match = self._search(pattern, 0)
        while match is not None and match.end() <= self.unarmed:
            match = self._search(pattern, match.start() + 1)
        return match

    def _search(self, pattern: regex.Pattern, pos: int) -> regex.Match | None:
        try:
            return pattern.search(self.text, pos, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            raise StopRegexTimeout(
                f"stop_regex {pattern.pattern!r} took longer than {SEARCH_TIMEOUT_S * 1000:g} ms to search the "
                f"output ({len(self.text)} characters): simplify it"
            ) from None
