"""Executes one expression on a program's trace: text, role blocks in the backend's chat
template, gen (one /generate call) and select (choices scored by their logprobs)."""

from __future__ import annotations

from typing import Any

from radixcluster.lang.backend import RuntimeEndpoint
from radixcluster.lang.ir import Concat, Expr, Gen, Role, Select
from radixcluster.lang.trace import RequestLog, Trace


def execute(expr: str | Expr, trace: Trace, backend: RuntimeEndpoint, log: RequestLog) -> None:
    if isinstance(expr, str):
        trace.text += expr
    elif isinstance(expr, Concat):
        for part in expr.parts:
            execute(part, trace, backend, log)
    elif isinstance(expr, Role):
        _role(expr, trace, backend, log)
    elif isinstance(expr, Gen):
        _gen(expr, trace, backend, log)
    elif isinstance(expr, Select):
        _select(expr, trace, backend, log)
    else:
        raise TypeError(
            f"cannot append a {type(expr).__name__} to a program state: use str, gen, select, system, user or assistant"
        )


def prefill(text: str, backend: RuntimeEndpoint, log: RequestLog) -> dict[str, Any]:
    """Send ``text`` with max_new_tokens 0: it is computed and cached, nothing is generated."""
    return _generate({"text": text, "sampling_params": {"max_new_tokens": 0}}, backend, log)


def _generate(payload: dict[str, Any], backend: RuntimeEndpoint, log: RequestLog) -> Any:
    answer = backend.generate(payload, session_id=log.session_id)
    for item in answer if isinstance(answer, list) else [answer]:
        log.record(item["meta_info"])
    return answer


def _role(expr: Role, trace: Trace, backend: RuntimeEndpoint, log: RequestLog) -> None:
    if trace.role is not None:
        raise ValueError(f"a {expr.role} message cannot start inside the unfinished {trace.role} message")
    template = backend.chat_template
    # The model's own template does this; without it our prompt would differ from the server's.
    if not trace.messages and expr.role != "system" and template.default_system_prompt:
        _role(Role("system", template.default_system_prompt), trace, backend, log)
    trace.text += template.role_prefix[expr.role]
    trace.role = expr.role
    start = len(trace.text)
    execute(expr.content, trace, backend, log)
    trace.messages.append({"role": expr.role, "content": trace.text[start:]})
    trace.text += template.role_suffix[expr.role]
    trace.role = None


def _gen(expr: Gen, trace: Trace, backend: RuntimeEndpoint, log: RequestLog) -> None:
    params = dict(expr.sampling_params)
    if trace.role is not None and backend.chat_template.stop:
        # Inside a message the end-of-turn marker ends the generation, as the template requires.
        stop = params.get("stop") or []
        params["stop"] = [*([stop] if isinstance(stop, str) else stop), *backend.chat_template.stop]
    answer = _generate({"text": trace.text, "sampling_params": params}, backend, log)
    trace.text += answer["text"]
    trace.assign(expr.name, answer["text"], answer["meta_info"])


def _select(expr: Select, trace: Trace, backend: RuntimeEndpoint, log: RequestLog) -> None:
    """Score every choice in one batched request and append the best by mean token logprob.

    The prefix-only request tells us its token count P (and caches it). The batch holds the
    prefix itself next to each prefix+choice, scored from position P-2: a choice's first
    token may merge with the prefix's last one, so a choice's tokens are those from the
    first position where its tokenization leaves the prefix's.
    """
    prefix = trace.text
    prompt_tokens = prefill(prefix, backend, log)["meta_info"]["prompt_tokens"]
    answers = _generate(
        {
            "text": [prefix, *(prefix + choice for choice in expr.choices)],
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": max(prompt_tokens - 2, 0),
        },
        backend,
        log,
    )
    prefix_entries = answers[0]["meta_info"]["input_token_logprobs"]
    scored = [_choice_entries(prefix_entries, answer["meta_info"]["input_token_logprobs"]) for answer in answers[1:]]
    normalized = [_mean([entry[0] for entry in entries if entry[0] is not None]) for entries in scored]
    best = max(range(len(normalized)), key=normalized.__getitem__)
    trace.text += expr.choices[best]
    meta = {"choices": list(expr.choices), "normalized_prompt_logprobs": normalized, "input_token_logprobs": scored}
    trace.assign(expr.name, expr.choices[best], meta)


def _choice_entries(prefix_entries: list[list[Any]], entries: list[list[Any]]) -> list[list[Any]]:
    split = 0
    while split < len(prefix_entries) and split < len(entries) and entries[split][1] == prefix_entries[split][1]:
        split += 1
    return entries[split:]


def _mean(values: list[float]) -> float:
    # Only a choice merged into a one-token prompt has no scored token: it cannot be ranked.
    return sum(values) / len(values) if values else float("-inf")
