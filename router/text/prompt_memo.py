"""Token ids of texts the router produced whole, so that a prompt which extends an earlier
request's prompt + answer (the next turn of a chat, the next call of a program) reuses the ids
the model actually generated. Re-encoding generated text can tokenize it differently (sampled
text, partial characters), and then the radix tree, which matches ids, would miss."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

HEAD_CHARS = 32  # texts are bucketed by their first characters to keep lookups short


@dataclass(slots=True)
class PromptMemo:
    """An LRU map from text to its token ids, queried for the longest remembered prefix."""

    capacity: int = 1024
    _ids: OrderedDict[str, np.ndarray] = field(default_factory=OrderedDict)
    _by_head: dict[str, set[str]] = field(default_factory=dict)

    def remember(self, text: str, ids: np.ndarray) -> None:
        """``ids`` tokenize ``text`` exactly (the caller checked that they decode to it)."""
        if text in self._ids:
            self._ids.move_to_end(text)
            return
        self._ids[text] = np.array(ids, dtype=np.int32)
        self._by_head.setdefault(text[:HEAD_CHARS], set()).add(text)
        if len(self._ids) > self.capacity:
            old, _ = self._ids.popitem(last=False)
            bucket = self._by_head[old[:HEAD_CHARS]]
            bucket.discard(old)
            if not bucket:
                del self._by_head[old[:HEAD_CHARS]]

    def longest_prefix(self, text: str) -> tuple[str, np.ndarray] | None:
        """The longest remembered text that ``text`` starts with, and its ids (or None)."""
        best = max(
            (t for t in self._by_head.get(text[:HEAD_CHARS], ()) if len(t) <= len(text) and text.startswith(t)),
            key=len,
            default=None,
        )
        if best is None:
            return None
        self._ids.move_to_end(best)
        return best, self._ids[best]
