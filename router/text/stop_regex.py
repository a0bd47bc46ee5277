"""SGLang's ``stop_regex``: end a request's streamed text at the first match of any pattern.

Unlike a stop string, the match stays in the text (SGLang does not trim it either), and
nothing is held back while streaming: a pattern can match text of any length, so no tail
can be known to be free of a future match.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class RegexStopChecker:
    """``feed(delta)`` returns ``(text to emit, stopped)``. The text searched is everything fed
    so far, so a match that spans deltas is found; the winner is the match that ends first
    (on a tie, the pattern listed first), and the emitted text ends where it ends."""

    __slots__ = ("patterns", "text", "stopped", "matched")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = [re.compile(p) for p in dict.fromkeys(patterns)]
        self.text = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped or not self.patterns:
            return ("", True) if self.stopped else (delta, False)
        emitted = len(self.text)
        self.text += delta
        hits = [(m.end(), i) for i, p in enumerate(self.patterns) if (m := p.search(self.text)) is not None]
        if not hits:
            return delta, False
        end, index = min(hits)
        self.stopped, self.matched = True, self.patterns[index].pattern
        return self.text[emitted : max(end, emitted)], True
