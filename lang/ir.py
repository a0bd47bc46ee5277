"""The expressions a program appends to its state (`s += ...`): text, gen, select, role blocks
(whole, or their begin and end marks), and their concatenations; plus their public constructors
(gen, gen_int, gen_string, select, system, user, assistant, and the *_begin / *_end marks)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from radixcluster.lang.choices import ChoicesSamplingMethod, token_length_normalized


class Expr:
    """Base of the expressions; ``a + b`` concatenates (``"Q: " + gen("a")``)."""

    __slots__ = ()

    def __add__(self, other: ExprLike) -> Concat:
        return Concat((self, other))

    def __radd__(self, other: ExprLike) -> Concat:
        return Concat((other, self))


@dataclass(slots=True, frozen=True)
class Concat(Expr):
    parts: tuple[ExprLike, ...]


@dataclass(slots=True, frozen=True)
class Gen(Expr):
    """Generate text into variable ``name``; ``sampling_params`` and ``logprob_params`` (the
    request's logprob fields) hold only what was set."""

    name: str | None
    sampling_params: dict[str, Any]
    logprob_params: dict[str, Any]


@dataclass(slots=True, frozen=True)
class Select(Expr):
    """Pick the choice the model finds most likely, by ``method`` (SGLang's default: the mean
    logprob per token)."""

    name: str | None
    choices: tuple[str, ...]
    method: ChoicesSamplingMethod = token_length_normalized

    def __post_init__(self) -> None:
        # an empty choice is scored too (its score: the prefix's last token's), as SGLang's
        if not self.choices or not all(isinstance(c, str) for c in self.choices):
            raise ValueError("select needs a non-empty list of strings as choices")


@dataclass(slots=True, frozen=True)
class Role(Expr):
    """One message: the role's prefix, the content, the role's suffix."""

    role: str
    content: ExprLike


@dataclass(slots=True, frozen=True)
class RoleMark(Expr):
    """The start (``begin``) or the end of a message whose content is appended in between
    (SGLang's ``user_begin()`` ... ``user_end()``)."""

    role: str
    begin: bool


ExprLike = str | Expr

# gen(dtype=...): the regex the answer must match, as SGLang's RuntimeEndpoint constrains it; a
# number also stops at the first space or newline
DTYPE_REGEX = {
    "int": r"[-+]?[0-9]+[ \n]*",
    "float": r"[-+]?[0-9]*\.?[0-9]+[ \n]*",
    "str": r"\"[\w\d\s]*\"",
    "bool": r"(True|False)",
}
NUMBER_STOPS = (" ", "\n")


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    regex: str | None = None,
    json_schema: str | dict[str, Any] | None = None,
    choices: list[str] | None = None,
    choices_method: ChoicesSamplingMethod | None = None,
) -> Gen | Select:
    """Generate into ``name``; unset parameters take the run's defaults, else the server's. With
    ``choices`` this is ``select(name, choices, choices_method=...)``. ``json_schema`` may be a dict or its JSON text.
    With ``return_logprob`` the gen's meta info holds the server's logprob fields. ``dtype``
    (int, float, str, bool or their names) constrains the answer by a regex instead of ``regex``."""
    if choices is not None:
        return select(name, choices, choices_method=choices_method or token_length_normalized)
    if isinstance(json_schema, dict):
        json_schema = json.dumps(json_schema)
    if dtype is not None:
        kind = dtype if isinstance(dtype, str) else getattr(dtype, "__name__", "")
        if kind not in DTYPE_REGEX:
            raise ValueError(f"dtype must be one of int, float, str, bool, got {dtype!r}")
        regex = DTYPE_REGEX[kind]
        if kind in ("int", "float"):
            stop = [*([stop] if isinstance(stop, str) else stop or []), *NUMBER_STOPS]
    params = {
        "max_new_tokens": max_tokens,
        "min_new_tokens": min_tokens,
        "stop": stop,
        "stop_token_ids": stop_token_ids,
        "stop_regex": stop_regex,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos,
        "regex": regex,
        "json_schema": json_schema,
    }
    logprobs = {
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
    }
    return Gen(name, given(params), given(logprobs))


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The entries that are not None (the parameters a caller set)."""
    return {key: value for key, value in values.items() if value is not None}


def gen_int(name: str | None = None, **params: Any) -> Gen | Select:
    """``gen(name, dtype=int, ...)``: an integer."""
    return gen(name, dtype=int, **params)


def gen_string(name: str | None = None, **params: Any) -> Gen | Select:
    """``gen(name, dtype=str, ...)``: a double-quoted string of letters, digits and spaces."""
    return gen(name, dtype=str, **params)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: ChoicesSamplingMethod = token_length_normalized,
) -> Select:
    """Append the most likely of ``choices`` by ``choices_method`` and store it in ``name``.
    Choices are scored, not sampled: ``temperature`` is SGLang's parameter, which its server
    backend also takes only as 0."""
    if temperature > 1e-5:
        raise ValueError(f"select scores its choices by their logprobs: temperature must be 0, got {temperature}")
    return Select(name, tuple(choices or ()), choices_method)


def system(content: ExprLike = "") -> Role:
    return Role("system", content)


def user(content: ExprLike = "") -> Role:
    return Role("user", content)


def assistant(content: ExprLike = "") -> Role:
    return Role("assistant", content)


# SGLang's marks around a message built by several appends: s += user_begin(); ...; s += user_end()
system_begin = functools.partial(RoleMark, "system", True)
system_end = functools.partial(RoleMark, "system", False)
user_begin = functools.partial(RoleMark, "user", True)
user_end = functools.partial(RoleMark, "user", False)
assistant_begin = functools.partial(RoleMark, "assistant", True)
assistant_end = functools.partial(RoleMark, "assistant", False)
