"""Token ids of texts the router produced whole, so that a prompt which extends an earlier
request's prompt + answer (the next turn of a chat, the next call of a program) reuses the ids
the model actually generated. Re-encoding generated text can tokenize it differently (sampled
text, partial characters), and then the radix tree, which matches ids, would miss. Texts are
remembered under their requests' cache salt: one namespace's answers never change how another's
prompts are tokenized."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

HEAD_CHARS = 32  # texts are bucketed by their first characters to keep lookups short


@dataclass(slots=True)
class PromptMemo:
    """An LRU map from text to its token ids, queried for the longest remembered prefix."""

    capacity: int = 1024
    _ids: OrderedDict[tuple[str, str], np.ndarray] = field(default_factory=OrderedDict)  # (salt, text)
    _by_head: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (salt, head): texts

    def remember(self, text: str, ids: np.ndarray, salt: str | None = None) -> None:
        """``ids`` tokenize ``text`` exactly (the caller checked that they decode to it)."""
        key = (salt or "", text)
        if key in self._ids:
            self._ids.move_to_end(key)
            return
        self._ids[key] = np.array(ids, dtype=np.int32)
        self._by_head.setdefault((key[0], text[:HEAD_CHARS]), set()).add(text)
        if len(self._ids) > self.capacity:
            (old_salt, old), _ = self._ids.popitem(last=False)
            head = (old_salt, old[:HEAD_CHARS])
            self._by_head[head].discard(old)
            if not self._by_head[head]:
                del self._by_head[head]

    def clear(self) -> None:
        self._ids.clear()
        self._by_head.clear()

    def longest_prefix(self, text: str, salt: str | None = None) -> tuple[str, np.ndarray] | None:
        """The longest text remembered under ``salt`` that ``text`` starts with, and its ids (or None)."""
        bucket = self._by_head.get((salt or "", text[:HEAD_CHARS]), ())
        best = max((t for t in bucket if len(t) <= len(text) and text.startswith(t)), key=len, default=None)
        if best is None:
            return None
        self._ids.move_to_end((salt or "", best))
        return best, self._ids[(salt or "", best)]
