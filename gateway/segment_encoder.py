"""Token ids of prompts with the long stretches of text between added tokens remembered: the
system prompt that many chat requests share is tokenized once, not once per request."""

from __future__ import annotations

import json
import re
from collections import OrderedDict

from radixcluster.router.text.tokenizer import Tokenizer

# Shorter stretches cost the tokenizer less than the lookup saves; and a user's one-off
# question would only push the shared system prompts out.
MIN_CACHED_CHARS = 256


def _splitter(tokenizer: Tokenizer) -> re.Pattern[str] | None:
    """A pattern that cuts text at its added tokens exactly where the tokenizer does, or None
    when stretches do not tokenize alone as they do in place: a normalizer or added tokens that
    take in the spaces around them, or a Metaspace pre-tokenizer (it marks only the text's first
    stretch)."""
    backend = tokenizer.backend
    added = backend.get_added_tokens_decoder().values()
    plain = all(not (t.lstrip or t.rstrip or t.single_word) for t in added)
    pre_tokenizer = json.dumps(json.loads(backend.to_str())["pre_tokenizer"])
    if backend.normalizer is not None or not plain or "Metaspace" in pre_tokenizer:
        return None
    # longest first: the tokenizer matches the longest added token at each place
    contents = sorted((t.content for t in added), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")") if contents else re.compile("(?!)")


class SegmentEncoder:
    """``Tokenizer.encode`` with an LRU of the ids of long stretches between added tokens."""

    def __init__(self, tokenizer: Tokenizer, capacity: int = 1024) -> None:
        self.tokenizer = tokenizer
        self._capacity = capacity
        self._split = _splitter(tokenizer)
        self._added = {t.content: i for i, t in tokenizer.backend.get_added_tokens_decoder().items()}
        self._stretches: OrderedDict[str, list[int]] = OrderedDict()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """What ``tokenizer.encode(text, add_special_tokens)`` returns."""
        if self._split is None:
            return self.tokenizer.encode(text, add_special_tokens)
        ids: list[int] = []
        # re.split with a group alternates stretches of text and the added tokens between them
        for i, part in enumerate(self._split.split(text)):
            if i % 2:
                ids.append(self._added[part])
            elif part:
                ids += self._stretch(part)
        return self.tokenizer.with_bos(ids, add_special_tokens)

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
