"""Executes one expression on a program's trace: text, role blocks in the backend's chat
template, gen (one /generate call) and select (choices scored by their logprobs)."""

from __future__ import annotations

from typing import Any

from radixcluster.lang.choices import mean, scored
from radixcluster.lang.ir import Concat, Expr, Gen, Role, RoleMark, Select
from radixcluster.lang.run import Run
from radixcluster.lang.trace import Trace


def execute(expr: str | Expr, trace: Trace, run: Run) -> None:
    if isinstance(expr, str):
        trace.text += expr
    elif isinstance(expr, Concat):
        for part in expr.parts:
            execute(part, trace, run)
    elif isinstance(expr, Role):
        _role(expr, trace, run)
    elif isinstance(expr, RoleMark):
        _mark(expr, trace, run)
    elif isinstance(expr, Gen):
        _gen(expr, trace, run)
    elif isinstance(expr, Select):
        _select(expr, trace, run)
    else:
        raise TypeError(
            f"cannot append a {type(expr).__name__} to a program state: use str, gen, select, system, user or assistant"
        )


def prefill(text: str, run: Run) -> dict[str, Any]:
    """Send ``text`` with max_new_tokens 0: it is computed and cached, nothing is generated."""
    return _generate({"text": text, "sampling_params": {"max_new_tokens": 0}}, run)


def _generate(payload: dict[str, Any], run: Run) -> Any:
    answer = run.backend.generate(payload, session_id=run.log.session_id)
    for item in answer if isinstance(answer, list) else [answer]:
        run.log.record(item["meta_info"])
    return answer


def _stream(payload: dict[str, Any], name: str | None, trace: Trace, run: Run) -> dict[str, Any]:
    """Generate with the answer appended to the text (and variable ``name``) as it arrives."""
    answer: dict[str, Any] = {"text": "", "meta_info": {}}
    trace.streaming = name
    try:
        for event in run.backend.generate_stream(payload, session_id=run.log.session_id):
            trace.text += event["text"][len(answer["text"]) :]
            if name is not None:
                trace.variables[name] = event["text"]
            answer = event
            trace.touched()
    finally:
        trace.streaming = None
    run.log.record(answer["meta_info"])
    return answer


def _role(expr: Role, trace: Trace, run: Run) -> None:
    _begin(expr.role, trace, run)
    execute(expr.content, trace, run)
    _end(expr.role, trace, run)


def _mark(expr: RoleMark, trace: Trace, run: Run) -> None:
    (_begin if expr.begin else _end)(expr.role, trace, run)


def _begin(role: str, trace: Trace, run: Run) -> None:
    if trace.role is not None:
        raise ValueError(f"a {role} message cannot start inside the unfinished {trace.role} message")
    template = run.backend.chat_template
    # The model's own template does this; without it our prompt would differ from the server's.
    if not trace.messages and role != "system" and template.default_system_prompt:
        _role(Role("system", template.default_system_prompt), trace, run)
    trace.text += template.role_prefix[role]
    trace.role, trace.role_start = role, len(trace.text)


def _end(role: str, trace: Trace, run: Run) -> None:
    if trace.role != role:
        inside = f"inside the {trace.role} message" if trace.role else "with no message open"
        raise ValueError(f"{role}_end() {inside}: end the {role} message its {role}_begin() started")
    # as SGLang's frontend lists them: the content without the whitespace it starts with
    trace.messages.append({"role": role, "content": trace.text[trace.role_start :].lstrip()})
    trace.text += run.backend.chat_template.role_suffix[role]
    trace.role = None


def _gen(expr: Gen, trace: Trace, run: Run) -> None:
    params = {**run.sampling, **expr.sampling_params}
    template = run.backend.chat_template
    if trace.role is not None and template.stop:
        # Inside a message the end-of-turn marker ends the generation, as the template requires.
        stop = params.get("stop") or []
        params["stop"] = [*([stop] if isinstance(stop, str) else stop), *template.stop]
    payload = {"text": trace.text, "sampling_params": params, **run.logprobs, **expr.logprob_params}
    if run.stream:
        answer = _stream(payload, expr.name, trace, run)
    else:
        answer = _generate(payload, run)
        trace.text += answer["text"]
    trace.assign(expr.name, answer["text"], answer["meta_info"])


def _select(expr: Select, trace: Trace, run: Run) -> None:
    """Score every choice in one batched request and append the one ``expr.method`` picks
    (SGLang's ``choices_method``), as SGLang's frontend scores them, so a program picks what it
    picks there.

    The prefix-only request tells us its token count P (and caches it). Each prefix+choice is
    scored from position P-2, as SGLang asks (a choice's first token may merge with the
    prefix's last one); the first entry has no logprob, so a choice's score is the mean over
    the prefix's last token and the choice's tokens.
    """
    prefix = trace.text
    prompt_tokens = prefill(prefix, run)["meta_info"]["prompt_tokens"]
    answers = _generate(
        {
            "text": [prefix + choice for choice in expr.choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": max(prompt_tokens - 2, 0),
        },
        run,
    )
    inputs = [answer["meta_info"]["input_token_logprobs"] for answer in answers]
    unconditional = None
    if expr.method.requires_unconditional_logprobs:
        # the same tokens with nothing before them
        alone = {
            "input_ids": [[entry[1] for entry in entries] for entries in inputs],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        }
        unconditional = [answer["meta_info"]["input_token_logprobs"] for answer in _generate(alone, run)]
    decision = expr.method(
        choices=list(expr.choices),
        normalized_prompt_logprobs=[mean(scored(entries)) for entries in inputs],
        input_token_logprobs=inputs,
        output_token_logprobs=[answer["meta_info"]["output_token_logprobs"] for answer in answers],
        unconditional_token_logprobs=unconditional,
    )
    trace.text += decision.decision
    trace.assign(expr.name, decision.decision, {"choices": list(expr.choices), **decision.meta_info})
