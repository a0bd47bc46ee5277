"""`@function` programs: run one against a backend, or many concurrently with run_batch."""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm import tqdm

from radixcluster.lang.backend import RuntimeEndpoint
from radixcluster.lang.state import ProgramState

MAX_BATCH_THREADS = 64

_default_backend: RuntimeEndpoint | None = None


def set_default_backend(backend: RuntimeEndpoint) -> None:
    """The backend of programs run without ``backend=``."""
    global _default_backend
    _default_backend = backend


def _resolve(backend: RuntimeEndpoint | None) -> RuntimeEndpoint:
    backend = backend or _default_backend
    if backend is None:
        raise RuntimeError("no backend: pass backend=RuntimeEndpoint(url) or call set_default_backend first")
    return backend


class SglFunction:
    """A program: a function whose first argument is the state ``s``."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]  # typeshed expects a function

    def run(self, *args: Any, backend: RuntimeEndpoint | None = None, **kwargs: Any) -> ProgramState:
        """Run the program to completion; the state holds its text and variables. A server
        error raises here (ServerError, with the server's message)."""
        state = ProgramState(_resolve(backend))
        self.func(state, *args, **kwargs)
        state.sync()
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        backend: RuntimeEndpoint | None = None,
        num_threads: int | None = None,
        progress_bar: bool = False,
    ) -> list[ProgramState]:
        """Run the program once per keyword-argument dict, concurrently; states in input order."""
        backend = _resolve(backend)
        if not batch_kwargs:
            return []
        workers = num_threads or min(len(batch_kwargs), MAX_BATCH_THREADS)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixcluster-batch") as pool:
            futures = [pool.submit(self.run, backend=backend, **kwargs) for kwargs in batch_kwargs]
            if progress_bar:
                for _ in tqdm(as_completed(futures), total=len(futures)):
                    pass
            return [future.result() for future in futures]


def function(func: Callable[..., Any]) -> SglFunction:
    """Decorator: ``@function def program(s, ...)``."""
    return SglFunction(func)
