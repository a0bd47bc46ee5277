"""OpenAI's tools on the chat endpoint. A forced tool call (``tool_choice`` "required" or a named
function) is generated under the JSON schema of the tools' parameters, as vLLM generates it,
then read back into ``tool_calls``: any model can make one, and how apt its arguments are depends
on whether its chat template shows it the tools. With "auto" the model decides, writing its
calls in its own format, which ``--tool-call-parser`` names (``tool_parsers``)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from radixcluster.router.api.errors import lone_surrogate
from radixcluster.router.api.tool_parsers import TOOL_CALL_FORMATS, ToolCallFormat

MAX_TOOLS = 128  # OpenAI's bound
# the chat's tool_choice values that force a call or none, as a refusal names them
CHAT_FORCING = (
    '"required" or {"type": "function", "function": {"name": ...}} to have a call generated under the '
    'tools\' JSON schema, or "none"'
)
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]  # OpenAI's rule for function names
# the schema of a function that declares no parameters
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _an_object(cls, parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        """A call's arguments are an object (``f(**arguments)``), so its schema is one, as
        OpenAI requires."""
        if parameters is not None and parameters.get("type", "object") != "object":
            raise ValueError(f'parameters must be a JSON schema of type "object", got type {parameters["type"]!r}')
        return parameters


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionIn

    def as_dict(self) -> dict[str, Any]:
        """The tool as chat templates read it (transformers' ``tools`` argument)."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class FunctionName(BaseModel):
    name: ToolName


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def forced_name(choice: ToolChoice | None) -> str | None:
    return choice.function.name if isinstance(choice, NamedToolChoice) else None


def tool_call_schema(tools: list[ToolIn], choice: ToolChoice | None, parallel: bool) -> dict[str, Any] | None:
    """The JSON schema a forced call is generated under (None when no call is forced): a named
    function's parameters, or for "required" a list of ``{"name", "parameters"}`` objects, one
    of the tools each (at most one unless ``parallel``)."""
    name = forced_name(choice)
    if name is not None:
        return next(t.function.parameters or NO_PARAMETERS for t in tools if t.function.name == name)
    if choice != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                # its references ("#/$defs/City", "#") pointed into its own root, now a part of the list's
                "parameters": relocated(
                    t.function.parameters or NO_PARAMETERS, f"#/items/anyOf/{i}/properties/parameters"
                ),
            },
            "required": ["name", "parameters"],
        }
        for i, t in enumerate(tools)
    ]
    listed = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    return listed if parallel else {**listed, "maxItems": 1}


# keywords whose values are data, not schemas: a "$ref" there is not a reference
_DATA_KEYWORDS = ("const", "enum", "default", "examples")


def relocated(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """A copy of ``schema`` to be placed at the JSON pointer ``base`` of another: each local
    ``$ref`` ("#", "#/$defs/X") made to point where its target now is. Walked with a stack, as
    deep as the schema goes."""
    root: dict[str, Any] = {}
    stack: list[tuple[Any, Any]] = [(schema, root)]  # (a part of the schema, its copy to fill)
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in items:
            if key == "$ref" and isinstance(value, str) and value.startswith("#"):
                value = base + value[1:]
            elif isinstance(value, (dict, list)) and key not in _DATA_KEYWORDS:
                copy: Any = {} if isinstance(value, dict) else [None] * len(value)
                stack.append((value, copy))
                value = copy
            target[key] = value
    return root


def read_tool_calls(text: str, choice: ToolChoice | None) -> list[dict[str, Any]] | None:
    """The ``tool_calls`` of a forced call's output, None when it does not parse (the generation
    was cut short: max_tokens, a stop string, an abort)."""
    try:
        value = json.loads(text)
    # ValueError: not JSON, or an integer of more digits than Python converts; RecursionError:
    # nested past the decoder's depth; either way, no call
    except (ValueError, RecursionError):
        return None
    name = forced_name(choice)
    if name is not None:
        return [_call(name, text.strip())] if isinstance(value, dict) else None
    if not isinstance(value, list) or not all(
        isinstance(c, dict) and {"name", "parameters"} <= c.keys() for c in value
    ):
        return None
    return [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in value]


@dataclass(frozen=True)
class ChatToolCalls:
    """Where a chat's answer carries its tool calls: all of it (a forced call), after what the
    model writes first (``format``: "auto" with a parser), or nowhere."""

    choice: ToolChoice | None
    names: frozenset[str] = frozenset()
    format: ToolCallFormat | None = None
    # the request's parallel_tool_calls: false keeps the first of the calls the model wrote
    # (as vLLM does: what is generated is the model's; a forced call's schema allows one)
    parallel: bool = True

    @classmethod
    def of(
        cls,
        tools: list[ToolIn] | None,
        choice: ToolChoice | None,
        parser: str | None,
        parallel: bool = True,
        forcing: str = CHAT_FORCING,
    ) -> ChatToolCalls:
        """ValueError (a 400) for "auto" without a parser: the model's calls could not be read;
        it names the choices that force a call as the request's API spells them (``forcing``)."""
        names = frozenset(t.function.name for t in tools or [])
        if choice != "auto" and not (choice is None and names):  # OpenAI's default with tools: "auto"
            return cls(choice, names)
        if parser is None:
            raise ValueError(
                'tool_choice "auto" (the default with tools) needs the server started with --tool-call-parser '
                f"(the model's format of tool calls); without one, send tool_choice {forcing}"
            )
        return cls("auto", names, TOOL_CALL_FORMATS[parser], parallel)

    @property
    def forced(self) -> bool:
        return self.choice == "required" or forced_name(self.choice) is not None

    def answer(self, text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
        """The answer's content and its ``tool_calls`` (None: it made none; then all of it is
        content, as is a call that was cut short or names no tool)."""
        if self.forced:
            calls = read_tool_calls(text, self.choice)
            return (None, calls) if calls is not None else (text, None)
        if self.format is None:
            return text, None
        parsed = self.format.parse(text, self.names)
        if parsed is None:
            return text, None
        before, read = parsed
        kept = read if self.parallel else read[:1]
        calls = [_call(name, json.dumps(arguments, ensure_ascii=False)) for name, arguments in kept]
        return before or None, calls

    def releasable(self, text: str) -> int:
        """How much of a growing answer a stream may send as content now."""
        if self.forced:
            return 0
        return len(text) if self.format is None else self.format.releasable(text)


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def template_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's earlier ``tool_calls`` as chat templates read them: each function's
    ``arguments`` a mapping (as transformers documents it), not OpenAI's JSON text. Arguments
    that are no JSON, or whose escapes spell a lone surrogate (no UTF-8 text holds one), stay
    the text the client sent."""
    read = []
    for call in calls:
        function = call.get("function")
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                arguments = json.loads(function["arguments"])
            except (ValueError, RecursionError):  # not JSON (or digits past Python's limit)
                arguments = function["arguments"]
            if lone_surrogate(arguments) is not None:
                arguments = function["arguments"]
            call = {**call, "function": {**function, "arguments": arguments}}
        read.append(call)
    return read
