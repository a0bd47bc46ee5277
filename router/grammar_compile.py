"""Compiling one regex / JSON-schema / EBNF / structural-tag spec with xgrammar, and trying each
new spec first in a child process under a limit: xgrammar's time on some specs grows steeply (a
schema nested 150, 300, 600 levels: 0.2, 1.6, 21 s; a regex of long counted repetitions), and a
compile that runs past it is stopped with its process, its core and memory with it, instead of
holding the router's compile thread for minutes and every spec queued behind it. The limit is
the child's CPU time, so a spec is judged by its own cost, not by how busy the machine is; a
machine too busy to compile it within its request's wait is a 503, not the spec's fault."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import xgrammar as xgr

from radixcluster.cpu_info import process_cpu_seconds
from radixcluster.router.json_schema_keywords import schema_text_problem, structural_tag_problem

GRAMMAR_KINDS = ("regex", "json_schema", "ebnf", "structural_tag")
# the JSON schemas of a kind's spec, checked for keywords the grammar would not enforce
_SCHEMA_PROBLEM = {"json_schema": schema_text_problem, "structural_tag": structural_tag_problem}
# xgrammar threads per compile: compiles share the cores with the router loop and the workers,
# so one compile never takes more than one core
COMPILE_THREADS = 1
# whitespace characters between two JSON tokens: room for a newline and 4-space indentation 15
# levels deep, as models pretty-print, while a sampled answer cannot pad a document forever
JSON_MAX_WHITESPACE = 64
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: " and sometimes a failed check
_ERROR_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: .*? is false: )?")
_MAX_ERROR_CHARS = 400
# how often the child checks that the router still runs (a compile releases the GIL)
_PARENT_CHECK_S = 0.5
# how often the router checks the child's CPU time while it compiles
_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Wait:
    """How long a request may wait for its spec (queued behind others' compiles included):
    ``limit_s`` from its arrival, until the ``time.monotonic()`` ``deadline``."""

    limit_s: float
    deadline: float

    @classmethod
    def starting_now(cls, limit_s: float) -> Wait:
        return cls(limit_s, time.monotonic() + limit_s)

    def left(self) -> float:
        return self.deadline - time.monotonic()


class GrammarError(ValueError):
    """A spec that does not compile (within its CPU time); the message says why."""


class GrammarBusy(RuntimeError):
    """A spec the server had no time to compile within its request's wait (others' compiles,
    a loaded machine): nothing is known against it, the client may retry."""


def too_slow(kind: str, cpu_limit_s: float) -> str:
    return f"the {_name(kind)} did not compile within {cpu_limit_s:g} s of compute: simplify it"


def too_busy(kind: str, wait_s: float) -> str:
    return f"the server could not compile the {_name(kind)} within {wait_s:g} s (busy): retry"


def _name(kind: str) -> str:
    return kind.replace("_", " ")


def new_compiler(tokenizer_info: xgr.TokenizerInfo) -> xgr.GrammarCompiler:
    # our cache bounds memory; xgrammar's would grow with every distinct spec
    return xgr.GrammarCompiler(tokenizer_info, max_threads=COMPILE_THREADS, cache_enabled=False)


def compile_spec(compiler: xgr.GrammarCompiler, kind: str, spec: str, any_whitespace: bool) -> xgr.CompiledGrammar:
    """``spec`` compiled; GrammarError with xgrammar's explanation if it does not compile, or
    when it allows no first token (it matches no text: every request would end at once).
    ``any_whitespace``: a JSON schema's documents may put any whitespace between tokens (SGLang's
    and vLLM's default), else compact separators only."""
    problem = _SCHEMA_PROBLEM[kind](spec) if kind in _SCHEMA_PROBLEM else None
    if problem is not None:
        raise GrammarError(f"invalid {kind}: {problem}")
    try:
        if kind == "regex":
            compiled = compiler.compile_regex(spec)
        elif kind == "json_schema":
            compiled = compiler.compile_json_schema(
                spec, any_whitespace=any_whitespace, max_whitespace_cnt=JSON_MAX_WHITESPACE
            )
        elif kind == "ebnf":
            compiled = compiler.compile_grammar(spec)
        elif kind == "structural_tag":
            compiled = compiler.compile_structural_tag(spec)
        else:
            raise ValueError(f"unknown grammar kind {kind!r}")
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"invalid {kind}: {_clean(str(exc))}") from exc
    first = np.zeros((1, -(-compiled.tokenizer_info.vocab_size // 32)), dtype=np.int32)
    xgr.GrammarMatcher(compiled).fill_next_token_bitmask(first, 0)
    if not first.any():
        raise GrammarError(f"invalid {kind}: it matches no text (no token can start an answer)")
    return compiled


class CompileProbe:
    """The child process that compiles each spec first (started at the first one, and again
    after one is stopped). A spec that compiles there within its time compiles here as fast.
    A plain subprocess: the router is a daemonic multiprocessing process, which may start none."""

    def __init__(self, tokenizer_info: xgr.TokenizerInfo) -> None:
        self._tokenizer_info = tokenizer_info.serialize_json()
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The child's, while one runs."""
        return None if self._process is None else self._process.pid

    def check(self, kind: str, spec: str, any_whitespace: bool, cpu_limit_s: float, wait: Wait) -> None:
        """Return once ``spec`` has compiled in the child within ``cpu_limit_s`` of its CPU time;
        else GrammarError saying why it does not compile, or that it took more (the child is
        stopped then); GrammarBusy when ``wait`` runs out first (the child is stopped too: it
        would go on taking a core)."""
        if wait.left() <= 0:  # queued behind other compiles for all of it
            raise GrammarBusy(too_busy(kind, wait.limit_s))
        try:
            conn = self._connection(wait)
            conn.send((kind, spec, any_whitespace))
            pid, spent = self.pid, process_cpu_seconds(self.pid or 0)
            while not conn.poll(_POLL_S):
                if process_cpu_seconds(pid or 0) - spent > cpu_limit_s:
                    self.close()
                    raise GrammarError(too_slow(kind, cpu_limit_s))
                if wait.left() <= 0:
                    self.close()
                    raise GrammarBusy(too_busy(kind, wait.limit_s))
            error = conn.recv()
        except (EOFError, OSError):  # it died (its log has why): the next spec gets a new one
            self.close()
            raise RuntimeError("the grammar compile process exited") from None
        if error is not None:
            raise GrammarError(error)

    def close(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self, wait: Wait) -> Connection:
        """The child's end, once it is ready to compile (its start-up is nobody's compile time);
        a child that died while idle (the OOM killer's pick) is replaced first."""
        if self._process is not None and self._process.poll() is not None:
            self.close()
        if self._conn is None:
            ours, theirs = socket.socketpair()
            with ours, theirs:
                command = [sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())]
                self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=[theirs.fileno()])
                self._conn = Connection(ours.detach())
            self._conn.send(self._tokenizer_info)
            if not self._conn.poll(max(wait.left(), 0.0)):
                self.close()
                raise GrammarBusy("the server could not start compiling grammars in time (busy): retry")
            self._conn.recv()  # the child's "ready"
        return self._conn


def _serve(conn: Connection, parent: int) -> None:
    """The child: compile each spec it is sent, answer None or why it does not compile."""
    threading.Thread(target=_exit_without, args=(parent,), daemon=True).start()
    compiler = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if compiler is None:  # the first message is the tokenizer's
            compiler = new_compiler(xgr.TokenizerInfo.deserialize_json(message))
            conn.send(None)  # ready
            continue
        kind, spec, any_whitespace = message
        try:
            compile_spec(compiler, kind, spec, any_whitespace)
            conn.send(None)
        except GrammarError as exc:
            conn.send(str(exc))


def _exit_without(parent: int) -> None:
    """End the child when the router is gone, even in the middle of a compile (a SIGKILLed
    router closes no pipe the compile would notice)."""
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_S)
    os._exit(0)


def _clean(message: str) -> str:
    text = _ERROR_PREFIX.sub("", message.strip())
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])), int(sys.argv[2]))
