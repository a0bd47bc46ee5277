"""Build a ``tokenizers.Tokenizer`` from a GGUF file's tokenizer metadata (llama.cpp key names).

A GGUF carries no ``tokenizer.json``: the vocabulary, merges, token types and special ids
live in ``tokenizer.ggml.*`` fields, and the pre-tokenizer is only named
(``tokenizer.ggml.pre``). We rebuild what llama.cpp builds, which is also what
transformers' GGUF loader builds except for the digit-splitting pre-tokenizers
(``smollm``, ``starcoder``): transformers drops their digit split, llama.cpp and the
models' own ``tokenizer.json`` keep it; we keep it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from radixcluster.model_config import open_gguf
from radixcluster.model_path import ModelPathError

logger = logging.getLogger(__name__)

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types

# llama.cpp treats these control tokens as end of generation, whatever eos_token_id says.
END_OF_GENERATION_TEXTS = frozenset(
    {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>"}
)

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_REGEX_BY_PRE = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), _QWEN2_SPLIT),
}
# llama.cpp splits every digit apart for these, then applies the GPT-2 regex.
_DIGITS_THEN_GPT2_PRE = frozenset({"smollm", "starcoder", "refact", "codeshell"})
_GPT2_PRE = frozenset({"default", "gpt2", "gpt-2"})


@dataclass(frozen=True, slots=True)
class GGUFTokenizer:
    """What a GGUF says about its tokenizer, with the backend built from it."""

    backend: Backend
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos_token: bool
    template_tokens: dict[str, str | None]  # bos_token, eos_token, unk_token, pad_token


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level vocabularies are spelled in."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars)}


def _metadata(path: Path) -> dict[str, Any]:
    return {key: value for key, value in open_gguf(path).metadata.items() if key.startswith("tokenizer.")}


def load_gguf_tokenizer(path: Path) -> GGUFTokenizer:
    """Read the tokenizer of a GGUF file; ModelPathError naming the file when it has none we support."""
    meta = _metadata(path)
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:
        raise ModelPathError(f"{path}: the GGUF file has no tokenizer metadata (tokenizer.ggml.model / tokens)")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    token_types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if model == "gpt2":
        backend = _byte_level_bpe(tokens, meta.get("tokenizer.ggml.merges") or [], meta.get("tokenizer.ggml.pre"))
        special_alphabet = set(bytes_to_unicode().values())
    elif model == "llama":
        backend = _sentencepiece_bpe(path, tokens, meta)
        special_alphabet = None
    else:
        raise ModelPathError(
            f"{path}: unsupported GGUF tokenizer model {model!r}; supported: 'gpt2' (byte-level BPE), 'llama'"
        )
    _add_special_tokens(backend, tokens, token_types, special_alphabet)

    def token_at(key: str) -> str | None:
        index = meta.get(key)
        return tokens[index] if index is not None else None

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    # Older sentencepiece files lack the flag and llama.cpp then adds BOS.
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama"))
    return GGUFTokenizer(
        backend=backend,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token_id=bos_id,
        eos_token_ids=_end_of_generation_ids(meta, tokens, token_types),
        add_bos_token=add_bos,
        template_tokens={
            f"{name}_token": token_at(f"tokenizer.ggml.{key}_token_id")
            for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))
        },
    )


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> Backend:
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A few files store tokens as plain text rather than in the byte alphabet; respell those.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    pairs = [(first, second) for first, second in (merge.split(" ", 1) for merge in merges)]
    backend = Backend(
        BPE(
            vocab=vocab, merges=pairs, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False
        )
    )
    backend.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = _SPLIT_REGEX_BY_PRE.get(pre or "")
    if split is not None:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in _GPT2_PRE:
        logger.warning("GGUF pre-tokenizer %r is not known here; splitting text with the GPT-2 regex", pre)
    return byte_level


def _sentencepiece_bpe(path: Path, tokens: list[str], meta: dict[str, Any]) -> Backend:
    """A SentencePiece BPE vocabulary (Llama 2, Mistral) as a byte-fallback BPE with ``▁`` for spaces."""
    vocab = {token: index for index, token in enumerate(tokens)}
    if "tokenizer.ggml.merges" in meta:
        pairs = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    elif "tokenizer.ggml.scores" in meta:
        pairs = _merges_from_scores(vocab, dict(zip(tokens, meta["tokenizer.ggml.scores"])))
    else:
        raise ModelPathError(f"{path}: the 'llama' GGUF tokenizer has neither merges nor scores")
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    backend = Backend(
        BPE(
            vocab=vocab,
            merges=pairs,
            unk_token=tokens[unk_id] if unk_id is not None else None,
            fuse_unk=True,
            byte_fallback=True,
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    return backend


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a token into two
    tokens, best-scored result first (what transformers derives for such files)."""
    merges = []
    for token, score in scores.items():
        local = [
            (token[:i], token[i:], score) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: m[2], reverse=True)
    return [(left, right) for left, right, _ in merges]


def _add_special_tokens(backend: Backend, tokens: list[str], token_types: list[int], alphabet: set[str] | None) -> None:
    """Control tokens become special added tokens (so ``<|im_start|>`` stays one id),
    user-defined ones plain added tokens. In a byte-level vocabulary a control token spelled
    outside the byte alphabet is a llama.cpp mislabel and is left alone."""
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, token_types)
        if kind == CONTROL and (alphabet is None or set(token) <= alphabet)
    ]
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types)
        if kind == USER_DEFINED
    ]
    if control:
        backend.add_special_tokens(control)
    if user_defined:
        backend.add_tokens(user_defined)


def _end_of_generation_ids(meta: dict[str, Any], tokens: list[str], token_types: list[int]) -> tuple[int, ...]:
    ids = [meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    ids += [
        i
        for i, (token, kind) in enumerate(zip(tokens, token_types))
        if kind == CONTROL and token in END_OF_GENERATION_TEXTS
    ]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))
