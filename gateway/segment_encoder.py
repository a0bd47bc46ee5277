"""Token ids of prompts with the long stretches of text between added tokens remembered: the
system prompt that many chat requests share is tokenized once, not once per request."""

from __future__ import annotations

from collections import OrderedDict

from radixcluster.router.text.piece_encoder import AddedTokenCutter
from radixcluster.router.text.tokenizer import Tokenizer

# Shorter stretches cost the tokenizer less than the lookup saves; and a user's one-off
# question would only push the shared system prompts out.
MIN_CACHED_CHARS = 256


class SegmentEncoder:
    """``Tokenizer.encode`` with an LRU of the ids of long stretches between added tokens."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = 1024) -> None:
        self.tokenizer = tokenizer
        self._capacity = capacity
        self._cutter = AddedTokenCutter.for_backend(tokenizer.backend)
        self._stretches: OrderedDict[str, list[int]] = OrderedDict()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """What ``tokenizer.encode(text, add_special_tokens)`` returns."""
        if self._cutter is None:
            return self.tokenizer.encode(text, add_special_tokens)
        return self.tokenizer.with_bos(self._cutter.encode(text, self._stretch), add_special_tokens)

    def _stretch(self, text: str) -> list[int]:
        if len(text) < MIN_CACHED_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=False)
        ids = self._stretches.get(text)
        if ids is None:
            ids = self._stretches[text] = self.tokenizer.encode(text, add_special_tokens=False)
            if len(self._stretches) > self._capacity:
                self._stretches.popitem(last=False)
        else:
            self._stretches.move_to_end(text)
        return ids
