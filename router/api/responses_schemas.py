"""The request of OpenAI's Responses API (``POST /v1/responses``), read as a chat: the
instructions as a system message, then the input's messages. Nothing is stored, so a request
carries its whole conversation."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixcluster.router.api.native_schemas import SamplingParamsIn
from radixcluster.router.api.openai_schemas import (
    CHAT_DEFAULT_MAX_TOKENS,
    UNSUPPORTED_OPENAI,
    JsonSchemaFormat,
    OpenAIRequest,
    ResponseFormat,
)

# what the Responses API would do here that this server does not: refused unless null or empty
UNSUPPORTED_RESPONSES = {
    **UNSUPPORTED_OPENAI,
    "previous_response_id": "responses are not stored: send the whole conversation as input",
    "conversation": "conversations are not stored: send the whole conversation as input",
    "prompt": "stored prompt templates are not supported",
    "tools": "tools are not supported",
    "background": "background responses are not supported",
}


class InputText(BaseModel):
    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(BaseModel):
    """A message of the input (its ``type`` may be left out); other items (function calls,
    images, reasoning) are refused by the ``type`` they name."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def as_dict(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": self.role, "content": content}


class TextFormat(BaseModel):
    """``text.format``: the Responses API's response_format, its schema inline."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    def as_response_format(self) -> ResponseFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format of type json_schema needs a schema")
        schema = (
            None
            if self.schema_ is None
            else JsonSchemaFormat.model_validate({"name": self.name, "schema": self.schema_})
        )
        return ResponseFormat(type=self.type, json_schema=schema)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ResponsesIn(OpenAIRequest):
    """``POST /v1/responses``; one answer (``n`` stays 1), rendered with the chat template."""

    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS
    unsupported: ClassVar[dict[str, str]] = UNSUPPORTED_RESPONSES

    input: str | list[InputMessage] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=0)
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponsesIn:
        if self.n != 1:
            raise ValueError("n: a response has one output")
        if self.gateway_tokens is not None:
            self.gateway_tokens.check_count(1)
        if self.text is not None and self.text.format is not None:
            self.response_format = self.text.format.as_response_format()
        return self

    def messages(self) -> list[dict[str, Any]]:
        """The chat the model reads: the instructions as its system message, then the input."""
        if isinstance(self.input, str):
            said = [{"role": "user", "content": self.input}]
        else:
            said = [message.as_dict() for message in self.input]
        return ([{"role": "system", "content": self.instructions}] if self.instructions else []) + said

    def sampling(self) -> SamplingParamsIn:
        return self._sampling(self.max_output_tokens)
