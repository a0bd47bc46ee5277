"""`@function` programs: run one against a backend, or many concurrently with run_batch."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
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
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].name != "s" or params[0].kind is inspect.Parameter.KEYWORD_ONLY:
            # SGLang refuses the same at definition: the state is passed first, so another first
            # parameter would get the state and the program's own arguments would shift
            raise TypeError(f'the first argument of the program {func.__name__!r} must be the state "s"')
        self.func = func
        functools.update_wrapper(self, func)

    def run(
        self,
        *args: Any,
        backend: RuntimeEndpoint | None = None,
        stream: bool = False,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program to completion; the state holds its text and variables. A server
        error raises here (ServerError, with the server's message).

        As in SGLang, the sampling keywords (``max_new_tokens``, ``temperature``, ``stop``, ...,
        ``run.SAMPLING_DEFAULTS``) and the logprob fields set every gen's defaults; the other
        keywords are the program's. ``stream=True`` returns at once: the program runs on, its
        gens stream, and ``state.text_iter()`` yields the text as it arrives. ``use_thread`` is
        SGLang's and changes nothing: a state's appends always run on its own thread here."""
        run = start_run(_resolve(backend), kwargs, stream)
        state = ProgramState(run)
        if stream:
            state.start_program(lambda: self.func(state, *args, **kwargs))
            return state
        self.func(state, *args, **kwargs)
        state.sync()
        return state

    __call__ = run  # SGLang's ``program(...)``: a run

    def _batch_item(self, backend: RuntimeEndpoint, kwargs: dict[str, Any]) -> ProgramState:
        """One run of a batch: a failure is kept in its state (``state.error()``), as SGLang's
        run_batch keeps it, so one bad program loses none of the others' results."""
        state = ProgramState(start_run(backend, kwargs))
        try:
            self.func(state, **kwargs)
            state.sync()
        except Exception as exc:
            state.fail(exc)
        return state

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        backend: RuntimeEndpoint | None = None,
        num_threads: int | str | None = None,
        progress_bar: bool = False,
        generator_style: bool = False,
        **defaults: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run the program once per keyword-argument dict, concurrently; states in input order,
        each failed one holding its error (``state.error()``) where SGLang's holds it.
        ``defaults``: the sampling keywords of ``run``, for every run; ``num_threads`` "auto"
        (SGLang's default) or None: one thread per program, at most 64; ``generator_style``
        (SGLang's): the states as an iterator, each as soon as it and those before it are done."""
        backend = _resolve(backend)
        if num_threads == "auto" or num_threads is None:
            num_threads = min(len(batch_kwargs), MAX_BATCH_THREADS) or 1
        if not isinstance(num_threads, int) or num_threads < 1:
            raise ValueError(f'num_threads must be a positive int or "auto", got {num_threads!r}')
        states = self._batch(backend, [{**defaults, **kwargs} for kwargs in batch_kwargs], num_threads, progress_bar)
        return states if generator_style else list(states)

    def _batch(
        self, backend: RuntimeEndpoint, batch: list[dict[str, Any]], num_threads: int, progress_bar: bool
    ) -> Iterator[ProgramState]:
        with ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="radixcluster-batch") as pool:
            futures = [pool.submit(self._batch_item, backend, kwargs) for kwargs in batch]
            if progress_bar:
                for _ in tqdm(as_completed(futures), total=len(futures)):
                    pass
            for future in futures:
                yield future.result()


def function(func: Callable[..., Any]) -> SglFunction:
    """Decorator: ``@function def program(s, ...)``."""
    return SglFunction(func)
