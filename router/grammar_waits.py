"""Requests whose grammar is still compiling: the router loop goes on serving everyone else, then
admits each request once its grammar is ready, or refuses it: a 400 when the spec does not
compile (within its CPU time), a 503 when the server had no time to compile it within the wait."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

import xgrammar as xgr

from radixcluster.router.grammar import GrammarCache, GrammarKey
from radixcluster.router.grammar_compile import GrammarBusy, GrammarError, Wait, too_busy

logger = logging.getLogger(__name__)

# the CPU time a spec's compile may take before it is refused (400: a spec this costly is the spec's fault)
GRAMMAR_COMPILE_TIMEOUT_S = 10.0
# how long a request may wait for its grammar, queued behind other compiles on a loaded machine
# included, before it is refused (503: nothing is known against the spec)
GRAMMAR_WAIT_LIMIT_S = 60.0

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class GrammarOutcome(Generic[T]):
    """A wait that ended: the compiled grammar, or the error (and HTTP status) to answer."""

    payload: T
    compiled: xgr.CompiledGrammar | None
    error: str | None = None
    status: int = 200


@dataclass(slots=True)
class _Wait(Generic[T]):
    key: GrammarKey
    future: Future[xgr.CompiledGrammar]
    deadline: float
    payload: T


class GrammarWaits(Generic[T]):
    """Requests (by id) waiting for ``grammars`` to compile their spec in the background."""

    def __init__(
        self,
        grammars: GrammarCache,
        timeout_s: float = GRAMMAR_COMPILE_TIMEOUT_S,
        wait_s: float = GRAMMAR_WAIT_LIMIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.grammars = grammars
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self._clock = clock
        self._waits: dict[str, _Wait[T]] = {}

    def __len__(self) -> int:
        return len(self._waits)

    def __contains__(self, rid: str) -> bool:
        return rid in self._waits

    def rids(self) -> list[str]:
        return list(self._waits)

    def add(self, rid: str, key: GrammarKey, payload: T) -> None:
        future = self.grammars.compile_in_background(key, self.timeout_s, Wait.starting_now(self.wait_s))
        self._waits[rid] = _Wait(key, future, self._clock() + self.wait_s, payload)

    def cancel(self, rid: str) -> bool:
        """Stop waiting for ``rid`` (its client left); the compile itself goes on and is cached."""
        return self._waits.pop(rid, None) is not None

    def finished(self) -> list[GrammarOutcome[T]]:
        """The waits that ended since the last call, in arrival order."""
        self.grammars.collect()
        now = self._clock()
        ended = []
        for rid, wait in list(self._waits.items()):
            if wait.future.done():
                ended.append(self._outcome(rid, wait))
            elif now >= wait.deadline:
                ended.append(GrammarOutcome(wait.payload, None, too_busy(wait.key[0], self.wait_s), 503))
            else:
                continue
            del self._waits[rid]
        return ended

    def _outcome(self, rid: str, wait: _Wait[T]) -> GrammarOutcome[T]:
        exc = wait.future.exception()
        if isinstance(exc, GrammarError):
            return GrammarOutcome(wait.payload, None, str(exc), 400)
        if isinstance(exc, GrammarBusy):
            return GrammarOutcome(wait.payload, None, str(exc), 503)
        try:
            if exc is None:
                return GrammarOutcome(wait.payload, wait.future.result())
            raise exc
        except Exception:
            logger.exception("compiling the grammar of request %s failed", rid)
            return GrammarOutcome(wait.payload, None, "internal error while compiling the grammar", 500)
