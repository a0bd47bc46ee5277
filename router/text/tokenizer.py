"""The router's tokenizer: text <-> token ids and chat prompts, from a HF directory or a GGUF file."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as Backend

from radixcluster.model_path import ModelPathError
from radixcluster.router.text.chat_template import render_chat_template
from radixcluster.router.text.gguf_tokenizer import load_gguf_tokenizer
from radixcluster.router.text.piece_encoder import PieceEncoder

# characters on each side of an offset that splits_at pre-tokenizes: a piece (a word, a number's
# digit, a run of spaces or punctuation) is decided by its neighbours
SPLIT_WINDOW = 64
# a byte-fallback vocabulary entry (SentencePiece's): one byte of a character the vocabulary lacks
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level vocabulary spelling: printable bytes stand for themselves, the others
    for the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return {chr(b): b for b in kept} | {chr(256 + i): b for i, b in enumerate(moved)}


_BYTE_LEVEL = _byte_level_alphabet()


@dataclass(slots=True)
class Tokenizer:
    """A ``tokenizers`` backend plus what the model says about BOS, EOS and chat prompts.

    ``chat_template`` is None when the model ships none (prompts then use ChatML).
    ``eos_token_ids`` are all ids that end generation.
    """

    backend: Backend
    path: Path
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos_token: bool
    template_tokens: dict[str, str | None]
    special_ids: frozenset[int]
    added_texts: tuple[str, ...]  # what the added tokens spell (the encoder cuts the text at each)
    # names what turns a text or a chat into ids: two tokenizers with one fingerprint give the
    # same ids, so a gateway's ids can stand in for a replica's own
    fingerprint: str
    # the backend's encode, faster on ASCII text (None: the backend's pre-tokenizer is not one it spells)
    pieces: PieceEncoder | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; BOS first only if the model wants it and ``add_special_tokens``.

        Encode a rendered chat prompt with ``add_special_tokens=False``: the template
        writes any BOS itself.
        """
        if self.pieces is not None:
            return self.with_bos(self.pieces.encode(text), add_special_tokens)
        return self.with_bos(self.backend.encode(text, add_special_tokens=False).ids, add_special_tokens)

    def with_bos(self, ids: list[int], add_special_tokens: bool = True) -> list[int]:
        """``ids`` with BOS first if the model wants it and ``add_special_tokens`` (the
        backend's ids of a text come without)."""
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            return [self.bos_token_id, *ids]
        return ids

    def splits_at(self, text: str, offset: int) -> bool:
        """Whether encoding ``text`` gives the ids of ``text[:offset]`` and then those of the
        rest: an added token starts there, or the pre-tokenizer cuts the text there (its pieces
        are encoded apart; looked at in a window around ``offset``, as its rules are local).
        Without a pre-tokenizer, only an added token is known to cut."""
        if offset <= 0 or offset >= len(text) or text.startswith(self.added_texts, offset):
            return True
        pre = self.backend.pre_tokenizer
        if pre is None:
            return False
        start = max(0, offset - SPLIT_WINDOW)
        pieces = pre.pre_tokenize_str(text[start : offset + SPLIT_WINDOW])
        return any(begin == offset - start for _, (begin, _) in pieces)

    def shared_by_continuations(self, text: str) -> int:
        """How much of ``text`` every longer text that starts with it encodes the same way: all of
        it before its last pre-tokenizer piece, which what follows may extend (". " + "Question"
        is ".", " Question"); all of it when it ends with an added token or has one piece."""
        pre = self.backend.pre_tokenizer
        if pre is None or not text or text.endswith(self.added_texts):
            return len(text)
        start = max(0, len(text) - SPLIT_WINDOW)
        pieces = pre.pre_tokenize_str(text[start:])
        last = start + pieces[-1][1][0] if pieces else len(text)
        return last or len(text)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``, as the fast tokenizers SGLang and vLLM decode with: no spaces put
        around special tokens (their ``spaces_between_special_tokens`` changes nothing there)."""
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for a conversation; ValueError (a 400) on malformed messages."""
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt,
            tools,
            self.template_tokens,
            continue_final_message,
            template_kwargs,
        )

    def longest_token_chars(self) -> int:
        """The most characters of text one token stands for: the longest vocabulary entry (a
        byte-level entry spells one character per byte, and a character is at least a byte)."""
        return max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id`` as spelled in the vocabulary (None if out of range)."""
        return self.backend.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for, also when they are only part of a character (its
        text alone decodes to U+FFFD): read from its vocabulary entry, byte-level or byte-fallback."""
        text = self.decode([token_id], skip_special_tokens=False)
        piece = self.id_to_token(token_id) or ""
        if "\ufffd" not in text or self.is_special(token_id):
            return text.encode()
        if match := _BYTE_PIECE.fullmatch(piece):
            return bytes([int(match[1], 16)])
        if piece and all(c in _BYTE_LEVEL for c in piece):
            return bytes(_BYTE_LEVEL[c] for c in piece)
        return text.encode()

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids


def load_tokenizer(path: Path, chat_template: str | None = None) -> Tokenizer:
    """The tokenizer of a resolved model path (see ``radixcluster.model_path``): a Hugging
    Face directory with ``tokenizer.json`` or a GGUF file. ModelPathError naming the path
    when neither holds a tokenizer we can build. ``chat_template`` (``--chat-template``'s
    text) renders chats in place of the model's own."""
    if path.is_dir():
        return _from_hf_dir(path, chat_template)
    if not path.is_file():
        raise ModelPathError(f"tokenizer path {path} does not exist")
    gguf = load_gguf_tokenizer(path)
    return _assemble(
        gguf.backend,
        path,
        gguf.chat_template if chat_template is None else chat_template,
        gguf.bos_token_id,
        gguf.eos_token_ids,
        gguf.add_bos_token,
        gguf.template_tokens,
    )


def _assemble(
    backend: Backend,
    path: Path,
    chat_template: str | None,
    bos_token_id: int | None,
    eos_token_ids: tuple[int, ...],
    add_bos_token: bool,
    template_tokens: dict[str, str | None],
) -> Tokenizer:
    added = backend.get_added_tokens_decoder()
    what = [backend.to_str(), chat_template, bos_token_id, add_bos_token, template_tokens]
    fingerprint = hashlib.blake2b(json.dumps(what, sort_keys=True).encode(), digest_size=12).hexdigest()
    return Tokenizer(
        backend=backend,
        path=path,
        chat_template=chat_template,
        bos_token_id=bos_token_id,
        eos_token_ids=eos_token_ids,
        add_bos_token=add_bos_token,
        template_tokens=template_tokens,
        special_ids=frozenset(i for i, token in added.items() if token.special),
        added_texts=tuple(token.content for token in added.values() if token.content),
        fingerprint=fingerprint,
        pieces=PieceEncoder.for_backend(backend),
    )


def _read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelPathError(f"cannot read {file}: {exc}") from exc


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes a special token as a string or as a serialized AddedToken.
    return value.get("content") if isinstance(value, dict) else value


def _hf_chat_template(path: Path, config: dict[str, Any]) -> str | None:
    jinja_file = path / "chat_template.jinja"  # where transformers >= 4.50 saves it
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one is the chat template
        return next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _from_hf_dir(path: Path, chat_template: str | None) -> Tokenizer:
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelPathError(f"{path}: no tokenizer.json (only fast-tokenizer directories are supported)")
    try:
        backend = Backend.from_file(str(tokenizer_file))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed files
        raise ModelPathError(f"cannot load {tokenizer_file}: {exc}") from exc
    config = _read_json(path / "tokenizer_config.json")
    bos_token = _token_text(config.get("bos_token"))
    eos_token = _token_text(config.get("eos_token"))
    bos_id = backend.token_to_id(bos_token) if bos_token else None
    eos_ids = [backend.token_to_id(eos_token)] if eos_token else []
    generation_eos = _read_json(path / "generation_config.json").get("eos_token_id")
    eos_ids += generation_eos if isinstance(generation_eos, list) else [generation_eos]
    add_bos = config.get("add_bos_token")
    if add_bos is None:  # not stated: whatever tokenizer.json's post-processor does
        add_bos = bos_id is not None and backend.encode("", add_special_tokens=True).ids[:1] == [bos_id]
    return _assemble(
        backend,
        path,
        _hf_chat_template(path, config) if chat_template is None else chat_template,
        bos_id,
        tuple(dict.fromkeys(int(i) for i in eos_ids if i is not None)),
        bool(add_bos),
        {
            "bos_token": bos_token,
            "eos_token": eos_token,
            "unk_token": _token_text(config.get("unk_token")),
            "pad_token": _token_text(config.get("pad_token")),
        },
    )
