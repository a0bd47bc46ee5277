"""What every state of one program run shares: the server, the log of its requests, and what
``run(...)`` set for all its gens (sampling defaults a gen's own parameters override, logprob
fields, streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixcluster.lang.backend import RuntimeEndpoint
from radixcluster.lang.ir import given
from radixcluster.lang.trace import RequestLog

# run()'s keywords, as SGLang's SglFunction.run takes them; the rest are the program's arguments
SAMPLING_DEFAULTS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
)
LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


@dataclass(slots=True)
class Run:
    backend: RuntimeEndpoint
    log: RequestLog = field(default_factory=RequestLog)
    sampling: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] = field(default_factory=dict)
    stream: bool = False


def start_run(backend: RuntimeEndpoint, kwargs: dict[str, Any], stream: bool = False) -> Run:
    """A run whose defaults are taken (removed) from ``kwargs``, the keywords ``run`` was given;
    a keyword left at None is unset (the server's default applies)."""

    def take(names: tuple[str, ...]) -> dict[str, Any]:
        return given({name: kwargs.pop(name) for name in names if name in kwargs})

    return Run(backend, sampling=take(SAMPLING_DEFAULTS), logprobs=take(LOGPROB_FIELDS), stream=stream)
