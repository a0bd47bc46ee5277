"""Constrained decoding with xgrammar: compiled regex / JSON-schema / EBNF grammars (cached per
spec), one matcher per request, and the per-step vocab bitmask the worker applies before sampling."""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgrammar as xgr

from radixcluster.protocol import SamplingParams
from radixcluster.router.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# distinct specs kept compiled; the least recently used goes first (clients can send any number)
MAX_CACHED_GRAMMARS = 256
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes a failed check
_ERROR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")
_MAX_ERROR_CHARS = 400


class GrammarError(ValueError):
    """A regex, JSON schema or EBNF grammar that does not compile; the message says why."""


@dataclass(slots=True)
class RequestGrammar:
    """Where one request stands in its grammar: fills its row of the step's mask and follows
    every token it appends. Retraction keeps a request's output tokens, so the matcher never
    rolls back."""

    matcher: xgr.GrammarMatcher
    mask_width: int  # int32 words per mask row: ceil(model vocab / 32)

    def fill(self, mask: np.ndarray, row: int) -> None:
        """Write into ``mask[row]`` the tokens the grammar allows next (stop tokens only once
        it may end)."""
        self.matcher.fill_next_token_bitmask(mask, row)

    def accept(self, token: int) -> dict[str, Any] | None:
        """Advance past ``token``; the finish reason once the grammar has ended on a stop token."""
        if not self.matcher.accept_token(token):
            # the mask forbade it: the worker ignored the mask
            return {"type": "abort", "message": f"sampled token {token} violates the request's grammar"}
        if self.matcher.is_terminated():
            return {"type": "stop", "matched": token}
        return None


class GrammarCache:
    """Compiles grammars for one tokenizer and model vocabulary; each distinct (kind, spec) is
    compiled once and kept (LRU, ``MAX_CACHED_GRAMMARS`` entries). Not thread-safe: the router
    process calls it from its one loop."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.mask_width = -(-vocab_size // 32)
        # our own cache bounds memory; xgrammar's would grow with every distinct spec
        self._compiler = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size), cache_enabled=False)
        self._compiled: OrderedDict[tuple[str, str], xgr.CompiledGrammar] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec``; ``kind`` is "regex", "json_schema" or "ebnf".
        GrammarError (with xgrammar's explanation) if it does not compile."""
        key = (kind, spec)
        compiled = self._compiled.get(key)
        if compiled is not None:
            self._compiled.move_to_end(key)
            self.hits += 1
            return compiled
        compiled = self._compile(kind, spec)
        self.misses += 1
        self._compiled[key] = compiled
        if len(self._compiled) > MAX_CACHED_GRAMMARS:
            self._compiled.popitem(last=False)
        return compiled

    def _compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        try:
            if kind == "regex":
                return self._compiler.compile_regex(spec)
            if kind == "json_schema":
                # compact separators: free whitespace lets a small model pad forever
                return self._compiler.compile_json_schema(spec, any_whitespace=False)
            if kind == "ebnf":
                return self._compiler.compile_grammar(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"invalid {kind}: {_clean(str(exc))}") from exc
        raise ValueError(f"unknown grammar kind {kind!r}")

    def for_request(self, sampling: SamplingParams) -> RequestGrammar | None:
        """A fresh matcher for the grammar ``sampling`` asks for, or None when it asks for none."""
        for kind in ("regex", "json_schema", "ebnf"):
            spec = getattr(sampling, kind)
            if spec is not None:
                return RequestGrammar(xgr.GrammarMatcher(self.compile(kind, spec)), self.mask_width)
        return None


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int) -> xgr.TokenizerInfo:
    """xgrammar's view of our tokenizer, ``vocab_size`` wide (the model's logits, which may
    exceed the tokenizer's vocabulary; the extra ids are never allowed). Special tokens are
    blanked so a grammar cannot spell its text with them; EOS ids are the stop tokens."""
    backend = tokenizer.backend
    encoded = [""] * min(vocab_size, tokenizer.vocab_size)
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if token_id < len(encoded) and token_id not in tokenizer.special_ids:
            encoded[token_id] = token
    # the detection xgrammar's from_huggingface runs (byte-level / byte-fallback / raw, prefix
    # space), applied to our `tokenizers` backend directly: the router has no transformers tokenizer
    meta = xgr.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    return xgr.TokenizerInfo(
        encoded,
        meta["vocab_type"],
        vocab_size=vocab_size,
        stop_token_ids=list(tokenizer.eos_token_ids),
        add_prefix_space=meta["add_prefix_space"],
    )


def _clean(message: str) -> str:
    text = _ERROR_PREFIX.sub("", message.strip())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."
