"""Constrained decoding with xgrammar: compiled regex / JSON-schema / EBNF / structural-tag grammars
(cached per spec, compiled on a thread of their own so the router loop never waits for one, each
new spec tried first in a child process that is stopped past its CPU time), one matcher per request, and
the per-step vocab bitmask the worker applies before sampling."""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import xgrammar as xgr

from radixcluster.protocol import SamplingParams
from radixcluster.router.grammar_compile import GRAMMAR_KINDS, CompileProbe, Wait, compile_spec, new_compiler
from radixcluster.router.text.tokenizer import Tokenizer
from radixcluster.router.thinking_gate import MarkerMasks, ThinkingGate, marker_masks

logger = logging.getLogger(__name__)

# distinct specs kept compiled, and their memory; the least recently used goes first (clients
# can send any number, and a JSON schema's token masks take ~8 MB at SmolLM2's vocabulary)
MAX_CACHED_GRAMMARS = 256
MAX_CACHED_GRAMMAR_BYTES = 512 * 2**20
GrammarKey = tuple[str, str]  # (kind, spec)


@dataclass(slots=True)
class RequestGrammar:
    """Where one request stands in its grammar: fills its row of the step's mask and follows
    every token it appends. Retraction keeps a request's output tokens, so the matcher never
    rolls back."""

    matcher: xgr.GrammarMatcher
    mask_width: int  # int32 words per mask row: ceil(model vocab / 32)
    gate: ThinkingGate | None = None  # None: the grammar holds from the first token

    @property
    def masks(self) -> bool:
        """Whether the next token's row needs a mask (while the model thinks, mostly not)."""
        return self.gate is None or self.gate.restricts

    def fill(self, mask: np.ndarray, row: int) -> None:
        """Write into ``mask[row]`` the tokens allowed next: the grammar's (stop tokens only once
        it may end), or while the model thinks, what its gate allows."""
        if self.gate is None:
            self.matcher.fill_next_token_bitmask(mask, row)
        else:
            self.gate.fill(mask, row, self.matcher)

    def accept(self, token: int) -> dict[str, Any] | None:
        """Advance past ``token``; the finish reason once the grammar has ended on a stop token."""
        if self.gate is not None:
            step = self.gate.step(token)
            if step != "thinking":
                self.gate = None
            if step != "at":
                return None
        if not self.matcher.accept_token(token):
            # the mask forbade it: the worker ignored the mask
            return {"type": "abort", "message": f"sampled token {token} violates the request's grammar"}
        if self.matcher.is_terminated():
            return {"type": "stop", "matched": token}
        return None


@dataclass(slots=True, frozen=True)
class _Job:
    key: GrammarKey
    wait: Wait
    cpu_limit_s: float
    future: Future[xgr.CompiledGrammar]


class GrammarCache:
    """Compiles grammars for one tokenizer and model vocabulary; each distinct (kind, spec) is
    compiled once and kept (LRU, up to ``MAX_CACHED_GRAMMARS`` entries and ``max_bytes`` of
    them, the newest kept whatever its size).

    ``compile`` compiles on the caller's thread. The router uses ``lookup`` and
    ``compile_in_background`` instead: a spec not cached yet compiles on a daemon thread while the
    loop goes on, once it has compiled in the child process (``CompileProbe``) within its CPU
    time, and ``collect`` (on the router's thread, like every other method) caches what that
    thread finished."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        json_any_whitespace: bool = True,
        max_bytes: int = MAX_CACHED_GRAMMAR_BYTES,
    ) -> None:
        self.vocab_size = vocab_size
        # a JSON schema's whitespace: any (SGLang's and vLLM's default, so greedy answers agree
        # with theirs), or compact separators only (--constrained-json-disable-any-whitespace)
        self.json_any_whitespace = json_any_whitespace
        self.mask_width = -(-vocab_size // 32)
        self._tokenizer = tokenizer
        self._texts: list[str] = []  # each token's text, once a gate needs them
        self._gates: dict[tuple[str, str | None], MarkerMasks] = {}
        info = tokenizer_info(tokenizer, vocab_size)
        self._compiler = new_compiler(info)
        self._probe = CompileProbe(info)
        self._compiled: OrderedDict[GrammarKey, xgr.CompiledGrammar] = OrderedDict()
        self.max_bytes = max_bytes
        self.cached_bytes = 0
        self._inflight: dict[GrammarKey, Future[xgr.CompiledGrammar]] = {}
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.hits = 0
        self.misses = 0

    def compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        """The compiled grammar of ``spec``; ``kind`` is one of GRAMMAR_KINDS.
        GrammarError (with xgrammar's explanation) if it does not compile."""
        key = (kind, spec)
        compiled = self.lookup(key)
        if compiled is None:
            compiled = self._compile(kind, spec)
            self._store(key, compiled)
        return compiled

    def lookup(self, key: GrammarKey) -> xgr.CompiledGrammar | None:
        """The cached grammar of ``key``, or None (counted as a miss) when it must be compiled."""
        compiled = self._compiled.get(key)
        if compiled is None:
            self.misses += 1
            return None
        self._compiled.move_to_end(key)
        self.hits += 1
        return compiled

    def compile_in_background(self, key: GrammarKey, cpu_limit_s: float, wait: Wait) -> Future[xgr.CompiledGrammar]:
        """A future of ``key``'s compiled grammar, shared by every request that asks while it
        compiles: a GrammarError when it does not compile within ``cpu_limit_s`` of compute, a
        GrammarBusy when the first ask's ``wait`` runs out first (compiles ahead of it included)."""
        future = self._inflight.get(key)
        if future is None:
            future = self._inflight[key] = Future()
            self._jobs.put(_Job(key, wait, cpu_limit_s, future))
            if self._thread is None:
                # a daemon: a compile still running never holds the process up at exit
                self._thread = threading.Thread(target=self._work, name="grammar-compile", daemon=True)
                self._thread.start()
        return future

    def collect(self) -> None:
        """Cache the grammars the compile thread finished, also those nobody waits for any more
        (their requests left), so the next request with that spec finds it."""
        for key, future in list(self._inflight.items()):
            if future.done():
                del self._inflight[key]
                if future.exception() is None:
                    self._store(key, future.result())

    def matcher(self, compiled: xgr.CompiledGrammar, sampling: SamplingParams) -> RequestGrammar:
        """A request's own matcher of ``compiled``, held back while the model thinks when
        ``sampling`` says so (``grammar_after``, ``thinking_start``)."""
        gate = None
        if sampling.grammar_after is not None:
            masks = self._marker_masks(sampling.grammar_after, sampling.thinking_start)
            gate = ThinkingGate(masks, self._decode_spelled, opening=sampling.thinking_start is not None)
        return RequestGrammar(xgr.GrammarMatcher(compiled), self.mask_width, gate)

    def _marker_masks(self, end: str, start: str | None) -> MarkerMasks:
        """Computed once per pair of markers (a fraction of a second: every token's text)."""
        key = (end, start)
        if key not in self._gates:
            if not self._texts:
                ids = [[token] for token in range(min(self.vocab_size, self._tokenizer.vocab_size))]
                self._texts = self._tokenizer.backend.decode_batch(ids, skip_special_tokens=False)
            self._gates[key] = marker_masks(self._texts, self.mask_width, end, start)
        return self._gates[key]

    def _decode_spelled(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            kind, spec = job.key
            try:
                self._probe.check(kind, spec, self.json_any_whitespace, job.cpu_limit_s, job.wait)
                job.future.set_result(self._compile(kind, spec))
            except Exception as exc:  # handed to the request that waits; the thread goes on
                job.future.set_exception(exc)

    def _store(self, key: GrammarKey, compiled: xgr.CompiledGrammar) -> None:
        old = self._compiled.pop(key, None)
        if old is not None:
            self.cached_bytes -= old.memory_size_bytes
        self._compiled[key] = compiled
        self.cached_bytes += compiled.memory_size_bytes
        while len(self._compiled) > 1 and (
            len(self._compiled) > MAX_CACHED_GRAMMARS or self.cached_bytes > self.max_bytes
        ):
            self.cached_bytes -= self._compiled.popitem(last=False)[1].memory_size_bytes

    def _compile(self, kind: str, spec: str) -> xgr.CompiledGrammar:
        return compile_spec(self._compiler, kind, spec, self.json_any_whitespace)

    def for_request(self, sampling: SamplingParams) -> RequestGrammar | None:
        """A fresh matcher for the grammar ``sampling`` asks for, or None when it asks for none."""
        key = requested_grammar(sampling)
        return None if key is None else self.matcher(self.compile(*key), sampling)


def requested_grammar(sampling: SamplingParams) -> GrammarKey | None:
    """The (kind, spec) ``sampling`` asks for, or None."""
    for kind in GRAMMAR_KINDS:
        spec = getattr(sampling, kind)
        if spec is not None:
            return kind, spec
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
