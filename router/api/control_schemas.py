"""Pydantic models of SGLang's tokenizer and abort endpoints (/tokenize, /detokenize, /abort_request)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixcluster.router.api.native_schemas import TokenId, fits_context
from radixcluster.router.api.tool_calls import MAX_TOOLS, ToolIn


class TokenizeIn(BaseModel):
    """``POST /tokenize``: a prompt (or a list of them) encoded as /generate encodes it, or a
    chat rendered with the model's template and encoded as the chat endpoint does."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | list[str] | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False  # vLLM's: each id's vocabulary entry too, as ``token_strs``
    # a chat's, rendered as the chat endpoint renders them (vLLM's /tokenize takes them too)
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    chat_template_kwargs: dict[str, Any] | None = None

    _messages_fit = field_validator("messages", mode="before")(fits_context)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages must be given")
        return self

    def router_args(self) -> dict[str, Any]:
        if self.messages is not None:
            return {
                "messages": self.messages,
                "add_generation_prompt": self.add_generation_prompt,
                "tools": [t.as_dict() for t in self.tools] if self.tools else None,
                "chat_template_kwargs": self.chat_template_kwargs,
                "token_strs": self.return_token_strs,
            }
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        return {"prompts": prompts, "add_special_tokens": self.add_special_tokens, "token_strs": self.return_token_strs}

    def answer(self, tokenized: dict[str, Any], max_model_len: int) -> dict[str, Any]:
        """SGLang's response: one id list and its count, or a list of each for a list of prompts;
        with ``return_token_strs`` each id's vocabulary entry too, as vLLM gives them."""
        tokens, strs = tokenized["tokens"], tokenized.get("token_strs")
        one = not isinstance(self.prompt, list)
        answer = {
            "tokens": tokens[0] if one else tokens,
            "count": len(tokens[0]) if one else [len(t) for t in tokens],
            "max_model_len": max_model_len,
        }
        if strs is not None:
            answer["token_strs"] = strs[0] if one else strs
        return answer


class DetokenizeIn(BaseModel):
    """``POST /detokenize``: the text of one id list, or of each of a list of them."""

    model_config = ConfigDict(extra="ignore")

    tokens: list[TokenId] | list[list[TokenId]]
    skip_special_tokens: bool = True

    @property
    def is_batch(self) -> bool:
        return any(isinstance(t, list) for t in self.tokens)

    def router_args(self) -> dict[str, Any]:
        batch = self.tokens if self.is_batch else [self.tokens]
        return {"tokens": batch, "skip_special_tokens": self.skip_special_tokens}

    def answer(self, texts: list[str]) -> dict[str, Any]:
        """SGLang's ``text``, and the same as vLLM's ``prompt``."""
        text = texts if self.is_batch else texts[0]
        return {"text": text, "prompt": text}


class AbortIn(BaseModel):
    """``POST /abort_request``: end the request ``rid`` (its ``meta_info.id``), or all of them."""

    model_config = ConfigDict(extra="ignore")

    rid: str = ""
    abort_all: bool = False

    @model_validator(mode="after")
    def _something(self) -> AbortIn:
        if not self.rid and not self.abort_all:
            raise ValueError("give the rid of the request to abort, or abort_all: true")
        return self
