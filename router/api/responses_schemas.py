"""The request of OpenAI's Responses API (``POST /v1/responses``), read as a chat: the
instructions as a system message, then the input's items as messages (function calls as an
assistant's ``tool_calls``, their outputs as ``tool`` messages). Nothing is stored, so a request
carries its whole conversation."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

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
from radixcluster.router.api.tool_calls import ToolName, template_tool_calls

# what the Responses API would do here that this server does not: refused unless null or empty
UNSUPPORTED_RESPONSES = {
    **UNSUPPORTED_OPENAI,
    "previous_response_id": "responses are not stored: send the whole conversation as input",
    "conversation": "conversations are not stored: send the whole conversation as input",
    "prompt": "stored prompt templates are not supported",
    "background": "background responses are not supported",
    "return_token_ids": "token ids come with /v1/chat/completions and /v1/completions",
}
LOGPROBS = "message.output_text.logprobs"  # what include names for them
IncludeOption = Literal[
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
]
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


TextPartType = Literal["input_text", "output_text", "text"]
TEXT_PARTS = get_args(TextPartType)


class InputText(BaseModel):
    type: TextPartType
    text: str


def _joined(content: str | list[InputText]) -> str:
    """Its text: text parts one per line, as the chat's."""
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


class InputMessage(BaseModel):
    """A message of the input (its ``type`` may be left out)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    _parts_readable = readable_text_parts(TEXT_PARTS)

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": _joined(self.content)}


class FunctionCallItem(BaseModel):
    """A call the model made earlier (an output item sent back)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str
    name: ToolName
    arguments: str

    def as_call(self) -> dict[str, Any]:
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class FunctionCallOutputItem(BaseModel):
    """A function's answer to one of the model's calls."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]

    _parts_readable = readable_text_parts(TEXT_PARTS, field="output")

    def as_dict(self) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": self.call_id, "content": _joined(self.output)}


class ReasoningPart(BaseModel):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(BaseModel):
    """The model's thinking before its answer (an output item sent back): it reaches the template
    as the next assistant message's ``reasoning_content``, which templates that show thinking
    read and the others leave out."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["reasoning"]
    summary: list[ReasoningPart] = []
    content: list[ReasoningPart] | None = None

    def text(self) -> str:
        return "".join(part.text for part in self.content or self.summary)


def _item_type(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return kind or "message"


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class TextFormat(BaseModel):
    """``text.format``: the Responses API's response_format, its schema inline."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    # echoed in the response as given (OpenAI's); the schema is enforced whatever ``strict`` says
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format of type json_schema needs a schema")
        return self

    def as_response_format(self) -> ResponseFormat:
        schema = (
            None
            if self.schema_ is None
            else JsonSchemaFormat.model_validate({"name": self.name, "schema": self.schema_})
        )
        return ResponseFormat(type=self.type, json_schema=schema)


class ReasoningConfig(BaseModel):
    """``reasoning``: its ``effort`` reaches the template as the chat's ``reasoning_effort`` does
    (a summary of the thinking is not written: the thinking comes whole, with a reasoning parser)."""

    model_config = ConfigDict(extra="ignore")

    effort: ReasoningEffort | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ResponsesIn(OneAnswerRequest):
    """``POST /v1/responses``; one answer (``n`` stays 1), rendered with the chat template. Its
    function tools and tool_choice are the chat's, written flat (``{"type": "function",
    "name": ...}``)."""

    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS
    unsupported: ClassVar[dict[str, str]] = UNSUPPORTED_RESPONSES
    answer = "a response"
    forcing = '"required" or {"type": "function", "name": ...} to have a call generated under the tools\' JSON schema, or "none"'

    input: str | list[InputItem] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: Count | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # SGLang's and vLLM's, as on the chat
    metadata: dict[str, str] | None = None
    # what else the output carries; of the API's options only the message's logprobs apply here
    # (the others name tools and inputs this server refuses, or encrypted reasoning it never writes)
    include: list[IncludeOption] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @model_validator(mode="before")
    @classmethod
    def _chat_tools(cls, data: Any) -> Any:
        """Flat function tools and tool_choice in the chat's shape; other kinds refused."""
        if not isinstance(data, dict):
            return data
        tools, choice = data.get("tools"), data.get("tool_choice")
        if isinstance(tools, list):
            data = {**data, "tools": [_chat_tool(tool) for tool in tools]}
        if isinstance(choice, dict):
            if choice.get("type") != "function":
                raise ValueError(
                    f'tool_choice of type {choice.get("type")!r} is not supported: give "none", "auto", '
                    '"required" or {"type": "function", "name": ...}'
                )
            data = {**data, "tool_choice": {"type": "function", "function": {"name": choice.get("name")}}}
        return data

    @field_validator("input", mode="before")
    @classmethod
    def _known_items(cls, items: Any, info: ValidationInfo) -> Any:
        fits_context(items, info)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and _item_type(item) not in ITEM_TYPES:
                raise ValueError(
                    f"input items of type {_item_type(item)!r} are not supported: messages, function_call, "
                    "function_call_output and reasoning items are"
                )
        return items

    @property
    def wants_logprobs(self) -> bool:
        """The message's text comes with its tokens' logprobs (asked as OpenAI asks them, or by
        ``top_logprobs`` alone)."""
        return self.top_logprobs is not None or LOGPROBS in (self.include or [])

    def answer_format(self) -> ResponseFormat | None:
        return self.text.format.as_response_format() if self.text and self.text.format else None

    def messages(self) -> list[dict[str, Any]]:
        """The chat the model reads: the instructions as its system message, then the input.
        An assistant's text and the calls after it are one message; thinking goes with the
        assistant message that follows it."""
        said: list[dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return [*said, {"role": "user", "content": self.input}]
        thought = None
        for item in self.input:
            if isinstance(item, ReasoningItem):
                thought = item.text()
                continue
            if isinstance(item, FunctionCallItem):
                if not said or said[-1]["role"] != "assistant":
                    said.append({"role": "assistant", "content": ""})
                said[-1].setdefault("tool_calls", []).extend(template_tool_calls([item.as_call()]))
            else:
                said.append(item.as_dict())
            if thought is not None and said[-1]["role"] == "assistant":
                said[-1].setdefault("reasoning_content", thought)
            thought = None
        return said

    def chat_input(self) -> dict[str, Any]:
        effort = self.reasoning.effort if self.reasoning else None
        return {
            "messages": self.messages(),
            "tools": self.template_tools(),
            "chat_template_kwargs": template_kwargs(self.chat_template_kwargs, effort),
        }

    def response_tools(self) -> list[dict[str, Any]]:
        """The tools as the response object lists them (flat)."""
        return [{"type": "function", **t.function.model_dump(exclude_none=True)} for t in self.tools or []]

    def output_limit(self) -> int | None:
        return self.max_output_tokens

    def output_limit_name(self) -> str:
        return "max_output_tokens"


def _chat_tool(tool: Any) -> Any:
    """A flat function tool in the chat's shape (one given in the chat's shape stays as it is)."""
    if not isinstance(tool, dict) or "function" in tool:
        return tool
    if tool.get("type") != "function":
        raise ValueError(f"tools of type {tool.get('type')!r} are not supported: only function tools")
    fields = ("name", "description", "parameters", "strict")
    return {"type": "function", "function": {key: tool[key] for key in fields if key in tool}}
