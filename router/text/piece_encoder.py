"""Token ids of text without the tokenizers library's pre-tokenizer where that is a plain regular
expression: for a byte-level BPE on ASCII text, the text is cut into the library's pieces here and
each piece's ids are remembered (the library's regex costs ~1.3 us a token, most of an encode)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

# onig's \s on ASCII (Unicode's White_Space): 0x1c-0x1f are not space there, as they are to str.isspace
_SPACE = r"\t\n\x0b\x0c\r "
# the ByteLevel pre-tokenizer's pattern (GPT-2's), \p{L} and \p{N} spelled as on ASCII
_GPT2 = rf"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_SPACE}A-Za-z0-9]+|[{_SPACE}]+(?![^{_SPACE}])|[{_SPACE}]+"
# the same after Digits(individual_digits) has cut every digit out: a digit is a piece of its
# own, and spaces before one end their piece (the pattern's lookahead saw that piece's end)
_GPT2_SINGLE_DIGITS = (
    rf"[0-9]|'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[^{_SPACE}A-Za-z0-9]+"
    rf"|[{_SPACE}]+(?![^{_SPACE}0-9])|[{_SPACE}]+"
)
# a bound on what is remembered: pieces are words, numbers' digits, punctuation, spaces
MAX_PIECES = 1 << 16
MAX_PIECE_CHARS = 32


def _pre_tokenizer(backend: Backend) -> dict[str, Any]:
    """The backend's pre-tokenizer as tokenizer.json spells it ({} for none); read alone, as
    the whole file's JSON would spell out the vocabulary too (~0.1 s)."""
    return json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}


class AddedTokenCutter:
    """Cuts text at its added tokens exactly where the tokenizer does: the stretches between
    them tokenize alone as they do in place."""

    def __init__(self, pattern: re.Pattern[str], ids: dict[str, int]) -> None:
        self._pattern = pattern
        self._ids = ids

    @classmethod
    def for_backend(cls, backend: Backend) -> AddedTokenCutter | None:
        """None when stretches do not tokenize alone as in place: a normalizer, added tokens
        that take in the spaces around them, or a Metaspace pre-tokenizer (it marks only the
        text's first stretch)."""
        added = backend.get_added_tokens_decoder()
        plain = all(not (t.lstrip or t.rstrip or t.single_word) for t in added.values())
        if backend.normalizer is not None or not plain or "Metaspace" in json.dumps(_pre_tokenizer(backend)):
            return None
        # longest first: the tokenizer matches the longest added token at each place
        contents = sorted((t.content for t in added.values()), key=len, reverse=True)
        pattern = re.compile("(" + "|".join(map(re.escape, contents)) + ")") if contents else re.compile("(?!)")
        return cls(pattern, {t.content: i for i, t in added.items()})

    def encode(self, text: str, stretch: Callable[[str], list[int]]) -> list[int]:
        """The ids of ``text``: its added tokens', and ``stretch``'s of the text between them."""
        ids: list[int] = []
        # re.split with a group alternates stretches of text and the added tokens between them
        for i, part in enumerate(self._pattern.split(text)):
            if i % 2:
                ids.append(self._ids[part])
            elif part:
                ids += stretch(part)
        return ids


def _ascii_pieces(backend: Backend) -> re.Pattern[str] | None:
    """The pattern that cuts ASCII text as the backend's pre-tokenizer does, or None when it is
    not a byte-level one whose cutting we spell (with or without single digits first)."""
    if not isinstance(backend.model, BPE) or backend.model.dropout is not None:
        return None  # dropout samples a piece's ids anew each time: nothing to remember
    pre = _pre_tokenizer(backend)
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    last = steps[-1] if steps else {}
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space") or not last.get("use_regex", True):
        return None
    if len(steps) == 1:
        return re.compile(_GPT2)
    if len(steps) == 2 and steps[0] == {"type": "Digits", "individual_digits": True}:
        return re.compile(_GPT2_SINGLE_DIGITS)
    return None


class PieceEncoder:
    """``backend.encode(text, add_special_tokens=False).ids``, with ASCII stretches cut here and
    the ids of their pieces remembered; the rest of the text goes to the library."""

    def __init__(self, backend: Backend, cutter: AddedTokenCutter, pieces: re.Pattern[str]) -> None:
        self._backend = backend
        self._cutter = cutter
        self._pieces = pieces
        self._known: dict[str, list[int]] = {}

    @classmethod
    def for_backend(cls, backend: Backend) -> PieceEncoder | None:
        """None for a tokenizer whose pieces are not cut by a pattern spelled here."""
        cutter = AddedTokenCutter.for_backend(backend)
        pieces = _ascii_pieces(backend)
        return cls(backend, cutter, pieces) if cutter is not None and pieces is not None else None

    def encode(self, text: str) -> list[int]:
        return self._cutter.encode(text, self._stretch)

    def _stretch(self, text: str) -> list[int]:
        if not text.isascii():
            return self._backend.encode(text, add_special_tokens=False).ids
        known = self._known
        ids: list[int] = []
        for piece in self._pieces.findall(text):
            got = known.get(piece)
            if got is None:
                # a piece alone is cut into itself, so the library's ids of it are its ids in place
                got = self._backend.encode(piece, add_special_tokens=False).ids
                if len(piece) <= MAX_PIECE_CHARS:
                    if len(known) >= MAX_PIECES:
                        known.clear()
                    known[piece] = got
            ids += got
        return ids
