"""`@function` programs: run one against a backend, or many concurrently with run_batch."""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from tqdm import tqdm

from radixcluster.lang.backend import RuntimeEndpoint
from radixcluster.lang.run import start_run
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


def flush_cache(backend: RuntimeEndpoint | None = None) -> dict[str, Any]:
    """Empty the radix cache of ``backend`` (default: the default backend's server)."""
    return _resolve(backend).flush_cache()


def get_server_info(backend: RuntimeEndpoint | None = None) -> dict[str, Any]:
    """``/get_server_info`` of ``backend`` (default: the default backend's server)."""
    return _resolve(backend).server_info()


class SglFunction:
    """A program: a function whose first argument is the state ``s``."""

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]  # typeshed expects a function

    def run(
        self, *args: Any, backend: RuntimeEndpoint | None = None, stream: bool = False, **kwargs: Any
    ) -> ProgramState:
        """Run the program to completion; the state holds its text and variables. A server
        error raises here (ServerError, with the server's message).

        As in SGLang, the sampling keywords (``max_new_tokens``, ``temperature``, ``stop``, ...,
        ``run.SAMPLING_DEFAULTS``) and the logprob fields set every gen's defaults; the other
        keywords are the program's. ``stream=True`` returns at once: the program runs on, its
        gens stream, and ``state.text_iter()`` yields the text as it arrives."""
        run = start_run(_resolve(backend), kwargs, stream)
        state = ProgramState(run)
        if stream:
            state.start_program(lambda: self.func(state, *args, **kwargs))
            return state
        self.func(state, *args, **kwargs)
        state.sync()
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        backend: RuntimeEndpoint | None = None,
        num_threads: int | str | None = None,
        progress_bar: bool = False,
        **defaults: Any,
    ) -> list[ProgramState]:
        """Run the program once per keyword-argument dict, concurrently; states in input order.
        ``defaults``: the sampling keywords of ``run``, for every run; ``num_threads`` "auto"
        (SGLang's default) or None: one thread per program, at most 64."""
        backend = _resolve(backend)
        if not batch_kwargs:
            return []
        if num_threads == "auto" or num_threads is None:
            num_threads = min(len(batch_kwargs), MAX_BATCH_THREADS)
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f'num_threads must be a positive int or "auto", got {num_threads!r}')
        with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="radixcluster-batch") as pool:
            futures = [pool.submit(self.run, backend=backend, **{**defaults, **kwargs}) for kwargs in batch_kwargs]
            if progress_bar:
                for _ in tqdm(as_completed(futures), total=len(futures)):
                    pass
            return [future.result() for future in futures]


def function(func: Callable[..., Any]) -> SglFunction:
    """Decorator: ``@function def program(s, ...)``."""
    return SglFunction(func)
