"""ProgramState: what a program's `s` is. Appends run in order on the state's own thread, so
forks proceed concurrently while reads (`s["x"]`, `s.text()`) wait for what they need. A run
with ``stream=True`` runs the program itself on a thread too, and `text_iter` reads its text as
it arrives."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from radixcluster.lang.backend import RuntimeEndpoint
from radixcluster.lang.interpreter import execute, prefill
from radixcluster.lang.ir import Expr, ExprLike, Role, RoleMark
from radixcluster.lang.run import Run
from radixcluster.lang.trace import Trace

JOIN_MODES = ("gather_variable", "concate_and_append")


class ProgramState:
    """The state of one running program (``s += ...``, ``s["name"]``, ``s.fork(n)``)."""

    def __init__(self, run: Run, trace: Trace | None = None) -> None:
        self._run = run
        self._trace = trace or Trace()
        self._forks: list[ProgramState] = []
        # a streamed run's program, running on its own thread: set once it has returned
        self._program: threading.Thread | None = None
        self._program_done = threading.Event()
        self._program_done.set()
        self._queue: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._draining = False
        self._error: BaseException | None = None

    def __iadd__(self, expr: str | Expr) -> ProgramState:
        if not isinstance(expr, (str, Expr)):
            raise TypeError(
                f"cannot append a {type(expr).__name__} to a program state: use str, gen, select, system, user or assistant"
            )
        self._submit(lambda: execute(expr, self._trace, self._run))
        return self

    def __getitem__(self, name: str) -> Any:
        self.sync()
        try:
            return self._trace.variables[name]
        except KeyError:
            raise KeyError(f"no variable {name!r}; this program has {sorted(self._trace.variables)}") from None

    def __setitem__(self, name: str, value: Any) -> None:
        """Set variable ``name`` after what was appended before (SGLang's ``set_var``)."""
        self._submit(lambda: self._trace.assign(name, value, {}))

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._trace.variables

    get_var = __getitem__
    set_var = __setitem__

    def error(self) -> BaseException | None:
        """What ended the program early (a run_batch item's, kept in its state), else None;
        reading its text or variables raises it."""
        try:
            self.sync()
        except Exception as exc:
            return exc
        return None

    def fail(self, exc: BaseException) -> None:
        """End the program with ``exc`` (the first error stays)."""
        self._error = self._error or exc

    def system(self, expr: ExprLike | None = None) -> AbstractContextManager[None] | None:
        """SGLang's ``s.system(expr)``: append a system message; without ``expr``, a context
        (``with s.system(): s += ...``) whose appends make up the message."""
        return self._role("system", expr)

    def user(self, expr: ExprLike | None = None) -> AbstractContextManager[None] | None:
        return self._role("user", expr)

    def assistant(self, expr: ExprLike | None = None) -> AbstractContextManager[None] | None:
        return self._role("assistant", expr)

    def _role(self, role: str, expr: ExprLike | None) -> AbstractContextManager[None] | None:
        if expr is None:
            return self._marked(role)
        self += Role(role, expr)
        return None

    @contextmanager
    def _marked(self, role: str) -> Iterator[None]:
        self += RoleMark(role, True)
        yield
        self += RoleMark(role, False)

    @property
    def backend(self) -> RuntimeEndpoint:
        return self._run.backend

    def text(self) -> str:
        self.sync()
        return self._trace.text

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """The program's text, or variable ``var_name``'s, in pieces as they arrive (a run with
        ``stream=True``; otherwise whole, once it is done). Ends when the program (or that
        variable's gen) is done; the program's error, if any, is raised at the end."""
        trace = self._trace
        if not self._run.stream:
            yield self.text() if var_name is None else self[var_name]
            return

        def current() -> str:
            return trace.text if var_name is None else str(trace.variables.get(var_name, ""))

        def done() -> bool:
            generated = var_name in trace.variables and trace.streaming != var_name
            return self._program_done.is_set() and self._idle.is_set() or (var_name is not None and generated)

        sent = 0
        while True:
            with trace.changed:
                while len(current()) <= sent and not done():
                    trace.changed.wait()
                piece, finished = current()[sent:], done()
            sent += len(piece)
            if piece:
                yield piece
            if finished:
                break
        if var_name is None or var_name not in trace.variables:
            self.sync()  # the program's error, if that is why it ended

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        return [dict(m) for m in self._trace.messages]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """The server's meta_info of gen ``name``; for a select, each choice's scores."""
        self.sync()
        return self._trace.meta_info[name]

    def get_cache_hit_info(self) -> dict[str, Any]:
        """Prompt tokens sent by this run (its forks included) and how many hit the radix cache."""
        self.sync()
        return self._run.log.cache_hit_info()

    def fork(self, n: int = 1) -> ForkGroup:
        """``n`` copies of this state that continue independently and concurrently. The shared
        text is first sent alone (prefill only) so every branch finds it cached."""
        if n < 1:
            raise ValueError(f"fork needs n >= 1, got {n}")
        self.sync()
        if n > 1 and self._trace.text:
            prefill(self._trace.text, self._run)
        forks = [ProgramState(self._run, self._trace.fork()) for _ in range(n)]
        self._forks.extend(forks)
        return ForkGroup(self, forks)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """SGLang's ``with s.copy() as c:``: one fork, joined back (its variables gathered)
        when the block ends."""
        forks = self.fork(1)
        try:
            yield forks[0]
        finally:
            forks.join()

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """SGLang's ``with s.var_scope("x"):``: ``x`` becomes the text appended inside the block."""
        start: list[int] = []
        self._submit(lambda: start.append(len(self._trace.text)))
        yield
        self._submit(lambda: self._trace.assign(name, self._trace.text[start[0] :], {}))

    def join(self, forks: Iterable[ProgramState], mode: str = "gather_variable") -> None:
        """Bring the forks' results back, in order: each variable they set becomes the list of
        their values (``gather_variable``), or their new text is appended (``concate_and_append``)."""
        if mode not in JOIN_MODES:
            raise ValueError(f"join mode must be one of {JOIN_MODES}, got {mode!r}")
        forks = list(forks)
        self._submit(lambda: self._merge(forks, mode))

    def sync(self) -> None:
        """Wait until everything appended so far (forks included) has run; raise its error.
        Outside a streamed run's program, wait for the program to return first."""
        if threading.current_thread() is not self._program:
            self._program_done.wait()
        self._idle.wait()
        for fork in self._forks:
            fork.sync()
        if self._error is not None:
            raise self._error

    def _merge(self, forks: list[ProgramState], mode: str) -> None:
        for fork in forks:
            fork.sync()
        if mode == "concate_and_append":
            self._trace.text += "".join(f._trace.text[f._trace.fork_offset :] for f in forks)
            return
        names = dict.fromkeys(name for f in forks for name in f._trace.assigned)
        for name in names:
            values = [f._trace.variables.get(name) for f in forks]
            self._trace.assign(name, values, {"forks": [f._trace.meta_info.get(name) for f in forks]})

    def start_program(self, program: Callable[[], None]) -> None:
        """Run ``program`` (a streamed run's function) on its own thread; its error, if it
        raises one, is this state's."""

        def body() -> None:
            try:
                program()
            except Exception as exc:
                self._error = self._error or exc
            finally:
                self._program_done.set()
                self._trace.touched()

        self._program_done.clear()
        self._program = threading.Thread(target=body, name="radixcluster-program", daemon=True)
        self._program.start()

    def _submit(self, op: Callable[[], None]) -> None:
        with self._lock:
            self._queue.append(op)
            self._idle.clear()
            if self._draining:
                return
            self._draining = True
        threading.Thread(target=self._drain, name="radixcluster-lang", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    self._idle.set()
                    break
                op = self._queue.popleft()
            # After a failure the program's text is incomplete: later appends are skipped.
            if self._error is None:
                try:
                    op()
                except Exception as exc:
                    self._error = exc
            self._trace.touched()
        self._trace.touched()  # idle now: a reader waiting for the end sees it

    def __repr__(self) -> str:
        # No waiting here: a debugger's repr must not block on pending requests.
        return f"ProgramState({self._trace.text!r})"


class ForkGroup(list):
    """The states of one fork; ``forks += expr`` appends to each, ``forks.join()`` merges back."""

    def __init__(self, parent: ProgramState, forks: list[ProgramState]) -> None:
        super().__init__(forks)
        self.parent = parent

    def __iadd__(  # type: ignore[override, misc]  # SGLang's `forks += expr`
        self, expr: ExprLike | list[ExprLike] | Callable[[int], ExprLike]
    ) -> ForkGroup:
        """The same ``expr`` to each branch; or, as SGLang's, a list of one per branch, or a
        function of the branch's index."""
        if isinstance(expr, list) and len(expr) != len(self):
            raise ValueError(f"a list appended to {len(self)} forks needs {len(self)} items, got {len(expr)}")
        for i, fork in enumerate(self):
            fork += expr[i] if isinstance(expr, list) else expr(i) if callable(expr) else expr
        return self

    def join(self, mode: str = "gather_variable") -> None:
        self.parent.join(self, mode)
