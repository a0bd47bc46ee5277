"""The request of Anthropic's Messages API (``POST /v1/messages`` and its ``count_tokens``), read
as a chat: ``system`` (and a system message between turns) as a system message, a user's
``tool_result`` blocks as ``tool`` messages before its text, an assistant's ``tool_use`` blocks
as its ``tool_calls`` and its ``thinking`` as its ``reasoning_content``. A last assistant message
is a prefill: the answer goes on from it. ``cache_control`` on a block pins the chat up to the
end of that block's message."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from radixcluster.protocol import PromptPin, SamplingParams
from radixcluster.router.api.cache_control_field import CacheControlIn
from radixcluster.router.api.errors import name_fields_as_sent
from radixcluster.router.api.native_schemas import Count, fits_context
from radixcluster.router.api.openai_schemas import (
    CHAT_DEFAULT_MAX_TOKENS,
    UNSUPPORTED_OPENAI,
    JsonSchemaFormat,
    OneAnswerRequest,
    ReasoningEffort,
    ResponseFormat,
    readable_text_parts,
    template_kwargs,
)
from radixcluster.router.api.tool_calls import MAX_TOOLS, ToolIn, ToolName

# what the Messages API would do here that this server does not: refused unless null or empty
UNSUPPORTED_MESSAGES = {
    **UNSUPPORTED_OPENAI,
    "container": "containers (code execution) run on Anthropic's servers",
    "mcp_servers": "MCP servers are called by Anthropic's servers: give their tools as tools",
}
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")
BLOCKS = "content blocks"  # Anthropic's name for a message's parts
# a tool whose input_schema is left out takes no input
NO_INPUT: dict[str, Any] = {"type": "object", "properties": {}}


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")  # citations

    type: Literal["text"]
    text: str
    cache_control: CacheControlIn | None = None


class ToolUseBlock(BaseModel):
    """A call the model made earlier (an assistant's block sent back)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["tool_use"]
    id: str
    name: ToolName
    input: dict[str, Any]
    cache_control: CacheControlIn | None = None

    def as_call(self) -> dict[str, Any]:
        """The call as chat templates read an assistant's ``tool_calls`` (arguments a mapping)."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.input}}


class ToolResultBlock(BaseModel):
    """A tool's answer to one of the model's calls; ``is_error`` is the tool's own word, and its
    text says what went wrong."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControlIn | None = None

    _text_only = readable_text_parts(("text",), BLOCKS)

    def as_dict(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.tool_use_id, "content": joined(self.content)}


class ThinkingBlock(BaseModel):
    """The model's earlier thinking; its ``signature`` (Anthropic's seal) has nothing to check here."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControlIn | None = None


class RedactedThinkingBlock(BaseModel):
    """Thinking Anthropic encrypted: no model here can read it, so it is left out of the chat."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControlIn | None = None


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


def last_marker(items: Iterable[Any]) -> CacheControlIn | None:
    """The ``cache_control`` of the last of ``items`` (blocks, tools) that has one."""
    marked = [item.cache_control for item in items if item.cache_control is not None]
    return marked[-1] if marked else None


def joined(content: str | list[TextBlock]) -> str:
    """The text of a string or of text blocks (one per line, as separate paragraphs)."""
    return content if isinstance(content, str) else "\n".join(block.text for block in content)


# the blocks each role's message may hold (redacted thinking too, which is left out)
_ROLE_BLOCKS: dict[str, tuple[type, ...]] = {
    "user": (TextBlock, ToolResultBlock, RedactedThinkingBlock),
    "assistant": (TextBlock, ToolUseBlock, ThinkingBlock, RedactedThinkingBlock),
    "system": (TextBlock,),
}


class MessageIn(BaseModel):
    """A turn: a user's, an assistant's, or (Anthropic's mid-conversation system beta, which
    Claude Code sends) a system message of text."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant", "system"]
    content: str | list[Block]

    _readable = readable_text_parts(BLOCK_TYPES, BLOCKS)

    @model_validator(mode="after")
    def _blocks_of_role(self) -> MessageIn:
        for block in self.blocks():
            if not isinstance(block, _ROLE_BLOCKS[self.role]):
                raise ValueError(f"a {self.role} message cannot hold a {block.type} block")
        return self

    def blocks(self) -> list[Any]:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content

    def as_dicts(self) -> list[dict[str, Any]]:
        """The chat's messages this one becomes: a user's tool results, then its text; an
        assistant's text with its calls and thinking; a system message's text."""
        blocks = self.blocks()
        texts = [block.text for block in blocks if isinstance(block, TextBlock)]
        if self.role == "system":
            return [{"role": "system", "content": "\n".join(texts)}]
        if self.role == "user":
            results = [block.as_dict() for block in blocks if isinstance(block, ToolResultBlock)]
            return [*results, {"role": "user", "content": "\n".join(texts)}] if texts or not results else results
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        calls = [block.as_call() for block in blocks if isinstance(block, ToolUseBlock)]
        if calls:
            message["tool_calls"] = calls
        thinking = "".join(block.thinking for block in blocks if isinstance(block, ThinkingBlock))
        if thinking:
            message["reasoning_content"] = thinking
        return [message]


class MessagesToolIn(ToolIn):
    """A custom tool (``name``, ``description``, ``input_schema``), read into the chat's shape."""

    cache_control: CacheControlIn | None = None

    @model_validator(mode="before")
    @classmethod
    def _chat_shape(cls, tool: Any) -> Any:
        if not isinstance(tool, dict) or "function" in tool:
            return tool
        kind = tool.get("type") or "custom"
        if kind != "custom":
            raise ValueError(
                f"tools of type {kind!r} are Anthropic's own tools, which this server does not run: "
                "give custom tools (name, description, input_schema)"
            )
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or NO_INPUT}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        return {"type": "function", "function": function, "cache_control": tool.get("cache_control")}


class ThinkingIn(BaseModel):
    """``thinking``: whether the model thinks first (the template's ``enable_thinking``, which
    thinking models' templates read). ``budget_tokens`` is checked against ``max_tokens``, within
    which the thinking counts; no served model reads a budget."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)


class ThinkingTurns(BaseModel):
    type: Literal["thinking_turns"]
    value: int = Field(ge=0)


class ClearThinkingIn(BaseModel):
    """``context_management``'s clear_thinking edit (which Claude Code sends): the thinking of
    all but the last ``keep`` assistant turns is left out of the prompt ("all": none is)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"] | ThinkingTurns = ThinkingTurns(type="thinking_turns", value=1)  # Anthropic's default


class ContextManagementIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    edits: list[ClearThinkingIn] = []

    @field_validator("edits", mode="before")
    @classmethod
    def _known_edits(cls, edits: Any) -> Any:
        for edit in edits if isinstance(edits, list) else []:
            kind = edit.get("type") if isinstance(edit, dict) else None
            if kind != "clear_thinking_20251015":
                raise ValueError(
                    f"context_management edits of type {kind!r} are not supported: this server clears "
                    "thinking (clear_thinking_20251015); send the tool results the model should read"
                )
        return edits

    def kept_thinking(self) -> int | None:
        """How many of the last thinking turns the prompt keeps (None: all)."""
        turns = [edit.keep.value for edit in self.edits if isinstance(edit.keep, ThinkingTurns)]
        return min(turns) if turns else None


class OutputFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """``output_config``: the answer's JSON schema, and the ``effort`` that reaches the template
    as the chat's ``reasoning_effort`` does."""

    model_config = ConfigDict(extra="ignore")

    format: OutputFormat | None = None
    effort: ReasoningEffort | None = None


class MessagesChat(OneAnswerRequest):
    """A Messages API conversation: what ``count_tokens`` reads, and the request without its
    output's fields. Its tools (``name``, ``description``, ``input_schema``) and ``tool_choice``
    (auto, any, tool, none) are read into the chat's."""

    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS
    unsupported: ClassVar[dict[str, str]] = UNSUPPORTED_MESSAGES
    answer = "a message"
    forcing = (
        '{"type": "any"} or {"type": "tool", "name": ...} to have a call generated under the tools\' '
        'input_schema, or {"type": "none"}'
    )

    messages: list[MessageIn] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=1)  # Anthropic's range
    # the chat's tools, each read from Anthropic's shape (a list of a subclass: list is invariant)
    tools: list[MessagesToolIn] | None = Field(None, max_length=MAX_TOOLS)  # type: ignore[assignment]
    system: str | list[TextBlock] | None = None
    thinking: ThinkingIn | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagementIn | None = None
    metadata: dict[str, Any] | None = None
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's and SGLang's, as on the chat
    # whether its cache_control may pin (with an admin key, only its holder's may): set by the route
    _may_pin: bool = PrivateAttr(default=True)

    _messages_fit = field_validator("messages", mode="before")(fits_context)

    @model_validator(mode="before")
    @classmethod
    def _chat_fields(cls, data: Any) -> Any:
        """The Messages API's names for the chat's fields."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("stop_sequences") is not None:
            data["stop"] = data.pop("stop_sequences")
        config = data.get("output_config")
        if data.get("output_format") is not None and isinstance(config, dict | None):  # the beta's name
            data["output_config"] = {**(config or {}), "format": data.pop("output_format")}
        choice = data.get("tool_choice")
        if isinstance(choice, dict):
            data["tool_choice"], parallel = _chat_tool_choice(choice)
            if parallel is not None:
                data["parallel_tool_calls"] = parallel
        return data

    @property
    def prefilled(self) -> bool:
        """The last message is the assistant's: the answer continues it."""
        return self.messages[-1].role == "assistant"

    def answer_format(self) -> ResponseFormat | None:
        found = self.output_config.format if self.output_config else None
        if found is None:
            return self.response_format
        return ResponseFormat(
            type="json_schema", json_schema=JsonSchemaFormat.model_validate({"schema": found.schema_})
        )

    def _read(self) -> tuple[list[dict[str, Any]], list[PromptPin]]:
        """The chat (its thinking cleared as ``context_management`` asks), and the pins its
        cache_control asks for (each at the end of its message; a tool's with the first message,
        in whose turn templates write the tools)."""
        said = [{"role": "system", "content": joined(self.system)}] if self.system else []
        heads = (last_marker(self.tools or []), last_marker(self.system if isinstance(self.system, list) else []))
        pins = [PromptPin(marker.ttl, 1) for marker in heads if marker is not None]
        for message in self.messages:
            said += message.as_dicts()
            marker = last_marker(message.blocks())
            if marker is not None:
                pins.append(PromptPin(marker.ttl, len(said)))
        kept = self.context_management.kept_thinking() if self.context_management else None
        if kept is not None:
            thoughtful = [m for m in said if "reasoning_content" in m]
            for m in thoughtful[: max(len(thoughtful) - kept, 0)]:
                del m["reasoning_content"]
        return said, pins

    def chat_input(self) -> dict[str, Any]:
        kwargs = dict(self.chat_template_kwargs or {})
        if self.thinking is not None:  # it decides enable_thinking before an effort would
            kwargs.setdefault("enable_thinking", self.thinking.type != "disabled")
        effort = self.output_config.effort if self.output_config else None
        return {
            "messages": self._read()[0],
            "continue_final_message": self.prefilled,
            "tools": self.template_tools(),
            "chat_template_kwargs": template_kwargs(kwargs, effort),
        }

    def pins(self) -> list[PromptPin]:
        return self._read()[1] + super().pins() if self._may_pin else []


class MessagesIn(MessagesChat):
    """``POST /v1/messages``: one answer, at most ``max_tokens`` long (required, as Anthropic's;
    0 computes the prompt into the cache and answers nothing, Anthropic's pre-warming)."""

    max_tokens: Count

    @model_validator(mode="after")
    def _budget_fits(self) -> MessagesIn:
        budget = self.thinking.budget_tokens if self.thinking else None
        if budget is not None and budget >= self.max_tokens:
            raise ValueError(f"thinking.budget_tokens ({budget}) must be less than max_tokens ({self.max_tokens})")
        return self

    def output_limit(self) -> int | None:
        return self.max_tokens

    def protocol_sampling(self) -> SamplingParams:
        """``max_tokens`` as a default: Anthropic's clients ask for their models' whole output
        (Claude Code 32,000), which gives way to the room the prompt leaves in the context."""
        return self._sampling(None).to_protocol(self.max_tokens, self.output_limit_name())


_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _chat_tool_choice(choice: dict[str, Any]) -> tuple[Any, bool | None]:
    """The chat's tool_choice, and its parallel_tool_calls (None: the default)."""
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    if not isinstance(kind, str) or kind not in _CHOICES:
        raise ValueError(f'tool_choice of type {kind!r}: give "auto", "any", "tool" (with a name) or "none"')
    return _CHOICES[kind], parallel


# Anthropic's names of the fields a Messages body is read into the chat's shape under
for _model in (MessagesChat, MessagesIn):
    name_fields_as_sent(
        _model,
        {
            r"^stop\b": "stop_sequences",
            r"^tools\.(\d+)\.function\.parameters": r"tools.\1.input_schema",
            r"^tools\.(\d+)\.function\.": r"tools.\1.",
            r"^(messages\.\d+\.content\.\d+)\.text\.text": r"\1.text",
        },
    )
