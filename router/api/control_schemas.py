"""Pydantic models of SGLang's tokenizer, abort, profiler and parser endpoints (/tokenize,
/detokenize, /abort_request, /start_profile, /parse_function_call, /separate_reasoning)."""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from radixcluster.protocol import MAX_PROFILE_STEPS
from radixcluster.router.api.field_error import FieldError
from radixcluster.router.api.native_schemas import TokenId, fits_context
from radixcluster.router.api.openai_schemas import ChatMessageIn
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.tool_calls import MAX_TOOLS, ToolIn
from radixcluster.router.api.tool_parsers import TOOL_CALL_FORMATS


class TokenizeIn(BaseModel):
    """``POST /tokenize``: a prompt (or a list of them) encoded as /generate encodes it, or a
    chat rendered with the model's template and encoded as the chat endpoint does."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | list[str] | None = None
    messages: list[ChatMessageIn] | None = None  # read as the chat endpoint reads them
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    # vLLM's and the chat's: the prompt ends inside the last message (an assistant's prefill)
    continue_final_message: bool = False
    return_token_strs: bool = False  # vLLM's: each id's vocabulary entry too, as ``token_strs``
    # a chat's, rendered as the chat endpoint renders them (vLLM's /tokenize takes them too)
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    chat_template_kwargs: dict[str, Any] | None = None

    _messages_fit = field_validator("messages", mode="before")(fits_context)

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeIn:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of prompt and messages must be given")
        if (
            self.continue_final_message
            and self.add_generation_prompt
            and "add_generation_prompt" in self.model_fields_set
        ):
            raise FieldError(
                "add_generation_prompt", "continue_final_message and add_generation_prompt cannot both be true"
            )
        return self

    def router_args(self) -> dict[str, Any]:
        if self.messages is not None:
            return {
                "messages": [message.as_dict() for message in self.messages],
                "add_generation_prompt": self.add_generation_prompt and not self.continue_final_message,
                "continue_final_message": self.continue_final_message,
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


PROFILE_ACTIVITIES = ("CPU", "GPU", "MEM")
# a profile's id and prefix name its trace files: no path of their own
_FILE_NAME_PART = re.compile(r"[\w.-]*")


class ProfileIn(BaseModel):
    """``/start_profile``: SGLang's body (what its bench_serving --profile sends), every field
    optional. What asks for more than one trace per rank over the steps between start and stop
    is refused by name."""

    model_config = ConfigDict(extra="ignore")

    output_dir: str | None = None
    num_steps: int | None = Field(None, ge=1, le=MAX_PROFILE_STEPS)
    activities: list[str] | None = None
    with_stack: bool | None = None
    record_shapes: bool | None = None
    profile_id: str | None = None
    profile_prefix: str | None = None
    start_step: int | None = None
    profile_by_stage: bool | None = None
    profile_stages: list[str] | None = None
    merge_profiles: bool | None = None

    @field_validator("activities")
    @classmethod
    def _known_activities(cls, value: list[str] | None) -> list[str] | None:
        unknown = sorted(set(value or ()) - set(PROFILE_ACTIVITIES))
        if unknown:
            raise ValueError(f"activities {unknown} are not recorded here; choose from {list(PROFILE_ACTIVITIES)}")
        return value

    @field_validator("profile_id", "profile_prefix")
    @classmethod
    def _file_name_part(cls, value: str | None) -> str | None:
        if value is not None and (not _FILE_NAME_PART.fullmatch(value) or value in (".", "..")):
            raise ValueError("may hold only letters, digits, '.', '_' and '-' (it names the trace files)")
        return value

    @model_validator(mode="after")
    def _one_trace_per_rank(self) -> ProfileIn:
        if self.start_step is not None:
            raise ValueError("start_step is not supported: the profile starts with the next step")
        if self.profile_by_stage or self.profile_stages:
            raise ValueError("profiling by stage is not supported: one trace covers prefill and decode steps alike")
        if self.merge_profiles:
            raise ValueError("merge_profiles is not supported: each TP rank writes its own trace")
        return self

    def router_args(self, output_dir: str) -> dict[str, Any]:
        """What the router's Profile carries; SGLang's defaults: CPU and GPU activities, stacks
        and shapes recorded, the time as the id."""
        return {
            "output_dir": output_dir,
            "profile_id": self.profile_id or str(time.time()),
            "prefix": f"{self.profile_prefix}-" if self.profile_prefix else "",
            "activities": self.activities or ["CPU", "GPU"],
            "with_stack": self.with_stack is not False,
            "record_shapes": self.record_shapes is not False,
            "num_steps": self.num_steps,
        }


def _known(value: str | None, known: dict[str, Any], what: str) -> str | None:
    if value is not None and value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(sorted(known))}")
    return value


class ParseFunctionCallIn(BaseModel):
    """``/parse_function_call``: the tool calls a model's ``text`` makes, read in the format
    ``tool_call_parser`` names (default: the server's --tool-call-parser)."""

    model_config = ConfigDict(extra="ignore")

    text: str
    tools: list[ToolIn] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_call_parser: str | None = None

    @field_validator("tool_call_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        return _known(value, TOOL_CALL_FORMATS, "tool_call_parser")


class SeparateReasoningIn(BaseModel):
    """``/separate_reasoning``: a model's ``text`` split into its thinking and its answer, as
    ``reasoning_parser`` marks them (default: the server's --reasoning-parser)."""

    model_config = ConfigDict(extra="ignore")

    text: str
    reasoning_parser: str | None = None
    return_blocks: bool = False

    @field_validator("reasoning_parser")
    @classmethod
    def _known_parser(cls, value: str | None) -> str | None:
        return _known(value, REASONING_FORMATS, "reasoning_parser")
