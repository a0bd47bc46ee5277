"""Pydantic models of the OpenAI-compatible requests, and their translation into SGLang's
sampling parameters (which also validates the ranges)."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from radixcluster.protocol import INT32_MAX, PromptPin, SamplingParams
from radixcluster.router.api.cache_control_field import CacheControlIn
from radixcluster.router.api.field_error import FieldError
from radixcluster.router.api.gateway_tokens import GatewayTokensIn
from radixcluster.router.api.native_schemas import (
    MAX_GRAMMAR_CHARS,
    UNSUPPORTED_REQUEST,
    Count,
    Deadline,
    Grammar,
    Key,
    LogitBias,
    SamplingParamsIn,
    TokenId,
    check_generations,
    drop_unsupported,
    fits_context,
    id_prompts,
    is_prompt_batch,
    prompts_fit_context,
)
from radixcluster.router.api.structural_tag import StructuralTag, StructuralTagFields
from radixcluster.router.api.tool_calls import (
    CHAT_FORCING,
    MAX_TOOLS,
    ToolChoice,
    ToolIn,
    forced_name,
    template_tool_calls,
    tool_call_schema,
)

# OpenAI's chat has no default cap; a bounded one keeps a forgotten max_tokens from running
# to the end of the context.
CHAT_DEFAULT_MAX_TOKENS = 512
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default
JSON_OBJECT_SCHEMA = '{"type": "object"}'

# SGLang extensions (and OpenAI's logit_bias) a request may carry, passed through to the
# sampling parameters.
_EXTRA_SAMPLING = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "regex",
    "json_schema",
    "ebnf",
    "ignore_eos",
    "stop_token_ids",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stop_regex",
    "logit_bias",
)


# vLLM's older names (its guided decoding, before 0.11) for structured_outputs' constraints
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}

# the fields that constrain an answer (beside response_format), which a forced tool call's own schema excludes
_CONSTRAINTS = ("structured_outputs", "regex", "json_schema", "ebnf")

# OpenAI fields that change what a request does and that this server does not implement: a
# silently ignored one would answer another question than the one asked (null and empty pass).
UNSUPPORTED_OPENAI = {
    **UNSUPPORTED_REQUEST,
    "suffix": "completions with a suffix (insertion) are not supported",
    # vLLM's extensions
    "use_beam_search": "beam search is not implemented",
    "allowed_token_ids": "use logit_bias to favour or ban tokens",
    "bad_words": "use logit_bias to ban tokens",
    "prompt_embeds": "prompts are text or token ids",
    "chat_template": "chats are rendered with the model's own template",
    "guided_whitespace_pattern": "JSON's whitespace is the server's --constrained-json-disable-any-whitespace",
    "documents": "chats are rendered with the model's own template, without documents",
    "logits_processors": "this server does not run client-supplied code (logits processors)",
    "prompt_logprobs": "score a prompt with /v1/completions, echo and logprobs",
    "return_tokens_as_token_ids": "logprob entries name each token by its text",
}
# vLLM's chat-only extensions likewise
UNSUPPORTED_CHAT = {
    **UNSUPPORTED_OPENAI,
    "echo": "a chat's answer does not repeat its last message",
    "add_special_tokens": "a chat's special tokens are the ones its template writes",
    "audio": "answers are text: this server has no audio output",
    # OpenAI's deprecated form of tools, which vLLM and SGLang do not read either
    "functions": 'give them as tools (each {"type": "function", "function": {...}})',
    "function_call": "use tool_choice",
}


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")


class ResponseFormat(StructuralTagFields):
    # SGLang's and vLLM's OpenAI routes take a structural tag here too
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise FieldError("json_schema", "response_format of type json_schema needs a json_schema")
        return self

    def grammar_params(self) -> dict[str, str]:
        """The sampling parameter (json_schema or structural_tag) this format asks for, if any."""
        if self.type == "json_object":
            return {"json_schema": JSON_OBJECT_SCHEMA}
        if self.type == "json_schema" and self.json_schema is not None:
            return {"json_schema": json.dumps(self.json_schema.schema_)}
        if self.type == "structural_tag":
            return {"structural_tag": self.structural_tag_spec}
        return {}


class StructuredOutputsIn(BaseModel):
    """vLLM's ``structured_outputs``: one constraint, read as SGLang's grammar parameters."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: StructuralTag = None

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputsIn:
        given = [
            name
            for name in ("json_", "regex", "choice", "grammar", "structural_tag")
            if getattr(self, name) is not None
        ]
        if len(given) + bool(self.json_object) != 1:
            raise ValueError(
                "structured_outputs takes exactly one of json, regex, choice, grammar, json_object, structural_tag"
            )
        return self

    def grammar_params(self) -> dict[str, str]:
        """The one sampling parameter (regex, json_schema, ebnf or structural_tag) that carries the constraint."""
        if self.structural_tag is not None:
            return {"structural_tag": self.structural_tag.structural_tag_spec}
        if self.json_ is not None:
            return {"json_schema": self.json_ if isinstance(self.json_, str) else json.dumps(self.json_)}
        if self.json_object:
            return {"json_schema": JSON_OBJECT_SCHEMA}
        if self.choice is not None:  # JSON's string escapes are the grammar's
            return {"ebnf": "root ::= " + " | ".join(json.dumps(c) for c in self.choice)}
        return {"regex": self.regex} if self.regex is not None else {"ebnf": self.grammar or ""}


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: the counts so far in every chunk too


class OpenAIRequest(BaseModel):
    """Fields both endpoints share; unknown fields are ignored like OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    # new tokens when the request sets no limit (lowered to what the context leaves)
    default_max_tokens: ClassVar[int]
    # fields it would have to act on and does not: refused unless null or empty
    unsupported: ClassVar[dict[str, str]] = UNSUPPORTED_OPENAI

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)  # OpenAI's range, which vLLM holds too (SGLang's /generate: any)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsIn | None = None  # vLLM's
    min_tokens: int = Field(0, ge=0)
    # vLLM's 0 (its default) is the whole vocabulary, SGLang's -1
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX)
    min_p: float | None = None
    repetition_penalty: float | None = None
    regex: Grammar = None
    json_schema: str | dict[str, Any] | None = None
    ebnf: Grammar = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    # vLLM calls it include_stop_str_in_output
    no_stop_trim: bool | None = Field(None, validation_alias=AliasChoices("no_stop_trim", "include_stop_str_in_output"))
    stop_regex: str | list[str] | None = None
    logit_bias: LogitBias = None
    rid: Key | None = None
    cache_salt: Key | None = None
    extra_key: Key | None = None
    deadline_s: Deadline = None
    cache_control: CacheControlIn | None = None  # pin the whole prompt
    gateway_tokens: GatewayTokensIn | None = None
    # vLLM's: the prompt's token ids and each choice's output ids beside the text
    return_token_ids: bool = False
    # vLLM's: the prompt keeps its last this many tokens (-1: as many as the context holds)
    truncate_prompt_tokens: int | None = Field(None, ge=-1, le=INT32_MAX)

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        # SGLang's extensions it would act on (lora_path, ...) are refused here too
        data = drop_unsupported(data, cls.unsupported)
        if not isinstance(data, dict):
            return data
        # OpenAI's fields are nullable, and clients (LangChain, LiteLLM) send nulls: a null
        # field is a field left out
        data = {k: v for k, v in data.items() if v is not None}
        guided = {_GUIDED[k]: data.pop(k) for k in list(data) if k in _GUIDED}
        if guided and "structured_outputs" in data:
            raise FieldError(
                "structured_outputs",
                "give a constraint as structured_outputs or as vLLM's older guided_* fields, not both",
            )
        return {**data, "structured_outputs": guided} if guided else data

    @model_validator(mode="after")
    def _stream_options_with_a_stream(self) -> OpenAIRequest:
        if self.stream_options is not None and not self.stream:
            raise FieldError(
                "stream_options", "stream_options is only allowed with stream: true"
            )  # as OpenAI and vLLM answer it
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Every chunk carries its choice's counts so far (vLLM's, with include_usage only)."""
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats

    def output_limit(self) -> int | None:
        """The most tokens the client asked for, in its endpoint's field (None: left out, or a
        call that generates nothing, such as count_tokens)."""
        return None

    def output_limit_name(self) -> str:
        """The field the client names its output limit in."""
        return "max_tokens"

    @model_validator(mode="after")
    def _min_within_the_limit(self) -> OpenAIRequest:
        limit = self.output_limit()
        if limit is not None and self.min_tokens > limit:
            raise FieldError("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed the output limit ({limit})")
        return self

    def sampling(self) -> SamplingParamsIn:
        """The request's sampling parameters in SGLang's terms."""
        return self._sampling(self.output_limit())

    def protocol_sampling(self) -> SamplingParams:
        """The router's sampling parameters: a limit left out is the endpoint's default, which
        the router lowers to the room the prompt leaves."""
        return self.sampling().to_protocol(self.default_max_tokens, self.output_limit_name())

    def pins(self) -> list[PromptPin]:
        """The prefixes its ``cache_control`` fields ask to pin."""
        return [PromptPin(self.cache_control.ttl)] if self.cache_control is not None else []

    def answer_format(self) -> ResponseFormat | None:
        """The format the answer is asked in."""
        return self.response_format

    def _sampling(self, max_new_tokens: int | None) -> SamplingParamsIn:
        """SGLang's parameters; raises pydantic's ValidationError for out-of-range values."""
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "min_new_tokens": self.min_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
            "frequency_penalty": self.frequency_penalty,
            "presence_penalty": self.presence_penalty,
        }
        params.update({name: getattr(self, name) for name in _EXTRA_SAMPLING if getattr(self, name) is not None})
        if self.top_k == 0:
            params["top_k"] = -1
        answer_format = self.answer_format()
        if answer_format is not None:
            params.update(answer_format.grammar_params())
        if self.structured_outputs is not None:
            params.update(self.structured_outputs.grammar_params())
        return SamplingParamsIn.model_validate(params)


def _last_ids(prompt: Any, keep: int) -> Any:
    """Each token-id prompt of ``prompt`` (one, or a batch) cut to its last ``keep`` ids; texts
    are cut by the router, once tokenized."""
    if not isinstance(prompt, list):
        return prompt
    if is_prompt_batch(prompt):
        return [ids[-keep:] if isinstance(ids, list) else ids for ids in prompt]
    return prompt[-keep:]


class CompletionIn(OpenAIRequest):
    """``POST /v1/completions``."""

    default_max_tokens = COMPLETION_DEFAULT_MAX_TOKENS

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Count | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)  # one sample per choice: only 1 (bench_serving sends it)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompts_fit(cls, prompt: Any, info: ValidationInfo) -> Any:
        """Token-id prompts cut to their last ``truncate_prompt_tokens`` (an earlier field)
        before they are counted, as vLLM cuts them: one longer than the context still serves."""
        keep, context = info.data.get("truncate_prompt_tokens"), (info.context or {}).get("context_length")
        keep = context if keep == -1 else keep
        if keep is not None and keep > 0 and (context is None or keep <= context):
            prompt = _last_ids(prompt, keep)
        return prompts_fit_context(prompt, info)

    @model_validator(mode="after")
    def _check(self) -> CompletionIn:
        prompts = self.prompts()
        if not prompts or any(len(p) == 0 for p in prompts):
            raise FieldError("prompt", "prompt must not be empty")
        check_generations(len(prompts), len(prompts) * self.n)
        if self.gateway_tokens is not None:
            self.gateway_tokens.check_count(len(prompts))
        if self.echo and self.truncate_prompt_tokens is not None:
            raise FieldError(
                "echo", "echo repeats the prompt as sent: it cannot be combined with truncate_prompt_tokens"
            )
        if self.best_of is not None and self.best_of > 1:
            raise FieldError(
                "best_of", f"best_of {self.best_of} is not supported: each choice is one sample (ask n samples instead)"
            )
        if self.best_of is not None and self.best_of < self.n:
            raise FieldError("best_of", f"best_of must be at least n (got best_of {self.best_of} and n {self.n})")
        return self

    def prompts(self) -> list[str | list[int]]:
        if isinstance(self.prompt, str):
            return [self.prompt]
        texts = [p for p in self.prompt if isinstance(p, str)]
        return [*texts] if texts else [*id_prompts([p for p in self.prompt if not isinstance(p, str)])]

    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def prompt_logprobs(self) -> bool:
        """``echo`` with ``logprobs``: the prompt's tokens are scored too (how lm-eval asks
        for a loglikelihood)."""
        return self.echo and self.logprobs is not None


def _readable_parts(parts: Any, known: tuple[str, ...], noun: str = "content parts") -> Any:
    """Refuse by name a part of a message this server cannot read (images, audio, video, files):
    the served models read text."""
    for part in parts if isinstance(parts, list) else []:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in known:
            raise ValueError(
                f"{noun} of type {kind!r} are not supported: the served model reads text; "
                f"{noun.split()[-1]} of type {', '.join(known)} are"
            )
    return parts


def readable_text_parts(known: tuple[str, ...], noun: str = "content parts", field: str = "content") -> Any:
    """A validator of ``field``: its parts fit the context and each is of a ``known`` type."""

    def check(cls: type, content: Any, info: ValidationInfo) -> Any:
        return _readable_parts(fits_context(content, info), known, noun)

    return field_validator(field, mode="before")(check)


class ContentPart(BaseModel):
    """A text part of a message (the served models read text only); an assistant's refusal is
    text too, as vLLM reads it."""

    type: Literal["text", "refusal"]
    text: str | None = None
    refusal: str | None = None
    cache_control: CacheControlIn | None = None  # pin the chat up to the end of this message

    @model_validator(mode="after")
    def _said(self) -> ContentPart:
        if not isinstance(getattr(self, self.type), str):
            raise ValueError(f"a {self.type} part needs its {self.type}")
        return self

    @property
    def said(self) -> str:
        return self.text if self.type == "text" else self.refusal  # type: ignore[return-value]


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # "function": OpenAI's deprecated role of a function's answer, still in its SDK's types
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    cache_control: CacheControlIn | None = None  # pin the chat up to the end of this message
    # an assistant's calls and a tool's answer to one, for templates that write them
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None  # the deprecated form of one call
    tool_call_id: str | None = None
    name: str | None = None
    # an assistant's earlier thinking (vLLM's field, also as "reasoning"), for templates that
    # show it (Qwen 3's, after the last user message)
    reasoning_content: str | None = Field(None, validation_alias=AliasChoices("reasoning_content", "reasoning"))

    _parts_fit = field_validator("tool_calls", mode="before")(fits_context)
    _parts_readable = readable_text_parts(("text", "refusal"))

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessageIn:
        # only an assistant's message may come without content (OpenAI's rule: one that made tool calls)
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def marker(self) -> CacheControlIn | None:
        """Its ``cache_control``, or that of its last content part that has one."""
        parts = self.content if isinstance(self.content, list) else []
        marked = [p.cache_control for p in parts if p.cache_control is not None]
        return self.cache_control or (marked[-1] if marked else None)

    def as_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "\n".join(part.said for part in content)  # as vLLM, and /tokenize's chats
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        calls = self.tool_calls or (
            [{"type": "function", "function": self.function_call}] if self.function_call else None
        )
        if calls:
            message["tool_calls"] = template_tool_calls(calls)
        extra = {"tool_call_id": self.tool_call_id, "name": self.name, "reasoning_content": self.reasoning_content}
        return message | {key: value for key, value in extra.items() if value is not None}


class ToolsRequest(OpenAIRequest):
    """A request that may offer the model tools: the chat, and the Responses API, which reads
    its tools into the same shape."""

    # its tool_choice values that force a call or none, as the refusal of "auto" names them
    forcing: ClassVar[str] = CHAT_FORCING

    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None  # OpenAI's default: "auto" with tools, else "none"
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_tools(self) -> ToolsRequest:
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) < len(names):
            raise FieldError("tools", "tools: each function needs a name of its own")
        if self.tool_choice not in (None, "none") and not names:
            raise FieldError("tool_choice", "tool_choice needs tools")
        forced = forced_name(self.tool_choice)
        if forced is not None and forced not in names:
            raise FieldError(
                "tool_choice", f"tool_choice names the function {forced!r}, which is not among the tools {names}"
            )
        schema = self.tool_schema()
        if schema is None:
            return self
        if len(schema) > MAX_GRAMMAR_CHARS:
            raise ValueError(
                f"tools: their calls' JSON schema is {len(schema)} characters, at most {MAX_GRAMMAR_CHARS}"
            )
        # a response_format shapes text content, which a forced call has none of: it stands aside,
        # as in OpenAI's API and vLLM; a constraint on the whole answer cannot
        constraints = [name for name in _CONSTRAINTS if getattr(self, name) is not None]
        if constraints:
            raise FieldError(
                constraints[0], f"a forced tool call is generated under its own schema: it cannot take {constraints[0]}"
            )
        return self

    def tool_schema(self) -> str | None:
        """The JSON schema a forced tool call is generated under; None when no call is forced."""
        schema = tool_call_schema(self.tools or [], self.tool_choice, self.parallel_tool_calls)
        return None if schema is None else json.dumps(schema)

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template is given them."""
        return [t.as_dict() for t in self.tools] if self.tools else None

    def chat_input(self) -> dict[str, Any]:
        """The prompt's fields of its GenerateRequest: the chat the template renders."""
        raise NotImplementedError

    def _sampling(self, max_new_tokens: int | None) -> SamplingParamsIn:
        sampling = super()._sampling(max_new_tokens)
        schema = self.tool_schema()
        # a forced call's schema replaces the response_format's constraint (json_schema or structural_tag)
        forced = {"json_schema": schema, "structural_tag": None}
        return sampling if schema is None else sampling.model_copy(update=forced)


# how hard a reasoning model thinks: OpenAI's names, and vLLM's beyond them
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


def template_kwargs(given: dict[str, Any] | None, effort: str | None) -> dict[str, Any] | None:
    """The chat template's own variables: the client's, and a reasoning effort passed on as vLLM
    passes it (``reasoning_effort``, and ``enable_thinking`` unless it is "none"), which the
    templates of thinking models read; the client's own variables win."""
    kwargs = dict(given or {})
    if effort is not None:
        kwargs.setdefault("reasoning_effort", effort)
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs or None


class OneAnswerRequest(ToolsRequest):
    """A chat under another shape (the Responses and Messages APIs): one ``answer`` (its ``n``
    stays 1) to one prompt."""

    answer: ClassVar[str]

    @model_validator(mode="after")
    def _one_answer(self) -> OneAnswerRequest:
        if self.n != 1:
            raise ValueError(f"n: {self.answer} is one answer")
        if self.gateway_tokens is not None:
            self.gateway_tokens.check_count(1)
        return self


class ChatCompletionIn(ToolsRequest):
    """``POST /v1/chat/completions``; the router renders ``messages`` with the chat template."""

    default_max_tokens = CHAT_DEFAULT_MAX_TOKENS
    unsupported = UNSUPPORTED_CHAT

    messages: list[ChatMessageIn] = Field(min_length=1)
    # vLLM's: false only with continue_final_message (which vLLM asks it with), else the prompt
    # ends with the assistant's turn opened
    add_generation_prompt: bool = True
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # SGLang's and vLLM's: the answer goes on from the last message (an assistant's), unclosed
    continue_final_message: bool = False
    # the template's own variables (SGLang's and vLLM's field), such as Qwen's enable_thinking
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # SGLang's, with --reasoning-parser: the thinking apart from the answer, streamed as it comes
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    modalities: list[Literal["text"]] | None = None  # answers are text: OpenAI's audio output is refused

    _messages_fit = field_validator("messages", mode="before")(fits_context)

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionIn:
        if self.gateway_tokens is not None:
            self.gateway_tokens.check_count(1)
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")  # as OpenAI answers it
        if (
            self.continue_final_message
            and self.add_generation_prompt
            and "add_generation_prompt" in self.model_fields_set
        ):
            raise FieldError(
                "add_generation_prompt",
                "continue_final_message and add_generation_prompt cannot both be true: the prompt either "
                "ends inside the last message or opens the assistant's turn",
            )
        if not self.add_generation_prompt and not self.continue_final_message:
            raise FieldError(
                "add_generation_prompt",
                "add_generation_prompt false is supported with continue_final_message only (the prompt then "
                "ends inside the last message); without it the prompt ends with the assistant's turn opened",
            )
        return self

    def chat_input(self) -> dict[str, Any]:
        return {
            "messages": [m.as_dict() for m in self.messages],
            "continue_final_message": self.continue_final_message,
            "tools": self.template_tools(),
            "chat_template_kwargs": template_kwargs(self.chat_template_kwargs, self.reasoning_effort),
        }

    def output_limit(self) -> int | None:
        return next((v for v in (self.max_completion_tokens, self.max_tokens) if v is not None), None)

    def output_limit_name(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def pins(self) -> list[PromptPin]:
        marked = [(i, m.marker()) for i, m in enumerate(self.messages)]
        return [PromptPin(c.ttl, i + 1) for i, c in marked if c is not None] + super().pins()
