"""Tool calls a model writes in its own format, read out of its answer (``--tool-call-parser``,
SGLang's and vLLM's names): what opens them, and how their text becomes (name, arguments)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixcluster.router.api.text_markers import marker_tail

Calls = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class ToolCallFormat:
    markers: tuple[str, ...]  # what opens the calls
    anchored: bool  # the calls are the whole answer (after whitespace), never after text
    read: Callable[[str], Calls | None]  # the calls' text -> (name, arguments), None if it is not that

    def split(self, text: str) -> tuple[str, str | None]:
        """The answer's text before its calls, and the calls' text (None: no calls)."""
        if self.anchored:
            body = text.lstrip()
            return ("", body) if body.startswith(self.markers) else (text, None)
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return (text[: min(found)], text[min(found) :]) if found else (text, None)

    def parse(self, text: str, names: frozenset[str]) -> tuple[str, Calls] | None:
        """The text before the calls and the calls, when ``text`` makes calls, all of them to
        tools in ``names``; None otherwise (then all of it is text)."""
        before, written = self.split(text)
        calls = self.read(written) if written is not None else None
        if not calls or any(name not in names for name, _ in calls):
            return None
        return before, calls

    def releasable(self, text: str) -> int:
        """How much of a growing answer can be streamed as text: up to its calls, less an end
        that may yet become a marker."""
        if self.anchored:
            body = text.lstrip()
            undecided = any(m.startswith(body) or body.startswith(m) for m in self.markers)
            return 0 if undecided else len(text)
        before, calls = self.split(text)
        if calls is not None:
            return len(before)
        return len(text) - marker_tail(text, self.markers)


def _objects(text: str) -> list[Any] | None:
    """The JSON values of ``text`` one after another (whitespace or ";" between), None if any
    part is not JSON."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == ";"):
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        # not JSON (or an integer of more digits than Python converts), or nested past the
        # decoder's depth: no call
        except (ValueError, RecursionError):
            return None
        values.append(value)


def _named(values: list[Any] | None, arguments_key: str) -> Calls | None:
    """``{"name": ..., <arguments_key>: {...}}`` objects as calls (``arguments`` is accepted for
    either key); None if any is not one."""
    calls = []
    for value in values or []:
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get(arguments_key, value.get("arguments", {}))
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            arguments = _objects(arguments)
            arguments = arguments[0] if arguments and len(arguments) == 1 else None
        if not isinstance(arguments, dict):
            return None
        calls.append((value["name"], arguments))
    return calls or None


_HERMES_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _hermes(text: str) -> Calls | None:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen 2.5, Hermes)."""
    values = [_objects(block) for block in _HERMES_CALL.findall(text)]
    if any(v is None or len(v) != 1 for v in values):
        return None
    return _named([v[0] for v in values if v], "arguments")


def _llama3(text: str) -> Calls | None:
    """Llama 3.1's JSON calls: ``{"name": ..., "parameters": {...}}``, ";" between several,
    after ``<|python_tag|>`` when the model writes it."""
    return _named(_objects(text.removeprefix("<|python_tag|>")), "parameters")


def _mistral(text: str) -> Calls | None:
    """Mistral's ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``."""
    values = _objects(text.removeprefix("[TOOL_CALLS]"))
    return _named(values[0], "arguments") if values and len(values) == 1 and isinstance(values[0], list) else None


def _pythonic(text: str) -> Calls | None:
    """A Python list of calls with literal keyword arguments: ``[get_weather(city="Paris")]``
    (Llama 3.2, Llama 4)."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        if not isinstance(tree.body, ast.List):
            return None
        calls = []
        for call in tree.body.elts:
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and not call.args):
                return None
            if any(k.arg is None for k in call.keywords):
                return None  # **kwargs
            calls.append((call.func.id, {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}))
        return calls or None
    except (SyntaxError, ValueError):
        return None


_HERMES = ToolCallFormat(("<tool_call>",), anchored=False, read=_hermes)
_LLAMA3 = ToolCallFormat(("<|python_tag|>", "{"), anchored=True, read=_llama3)
TOOL_CALL_FORMATS = {
    "qwen25": _HERMES,
    "qwen": _HERMES,
    "hermes": _HERMES,
    "llama3": _LLAMA3,
    "llama3_json": _LLAMA3,
    "mistral": ToolCallFormat(("[TOOL_CALLS]", "[{"), anchored=True, read=_mistral),
    "pythonic": ToolCallFormat(("[",), anchored=True, read=_pythonic),
}
