"""Pydantic models of SGLang's native ``/generate`` request, and their expansion into one
protocol GenerateRequest per prompt and sample."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

import regex
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from radixcluster.protocol import FLOAT32_MAX, INT32_MAX, INT64_MAX, INT64_MIN, GenerateRequest, SamplingParams
from radixcluster.router.api.field_error import FieldError
from radixcluster.router.api.gateway_tokens import GatewayTokensIn, prompt_tokens
from radixcluster.router.api.structural_tag import StructuralTag

DEFAULT_MAX_NEW_TOKENS = 128

# Bounds on what one request may ask for (README, "Limits"). Counts and lengths stop a single body
# from costing the router minutes or gigabytes; integer ranges (protocol) are what its arrays hold.
MAX_STOP_STRINGS = 32
MAX_STOP_CHARS = 256
MAX_STOP_REGEXES = 4  # each is searched over all the text so far at every step
MAX_STOP_TOKEN_IDS = 256
MAX_LOGIT_BIASES = 1024
MAX_GRAMMAR_CHARS = 64 * 1024  # a regex, JSON schema, EBNF grammar or structural tag
MAX_GENERATIONS = 256  # per HTTP request: prompts x n
MAX_DEADLINE_S = 24 * 3600.0
MAX_KEY_CHARS = 256  # a rid, cache_salt or extra_key

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Temperature = Annotated[float, Field(ge=0, le=FLOAT32_MAX)]
TopLogprobsNum = Annotated[int, Field(ge=0, le=20)]
LogprobStart = Annotated[int, Field(ge=-1, le=INT32_MAX)]  # -1: no prompt logprobs
# an optional per-request deadline, in seconds from arrival: what is not done by then is aborted (504)
Deadline = Annotated[float | None, Field(gt=0, le=MAX_DEADLINE_S)]
Grammar = Annotated[str | None, Field(max_length=MAX_GRAMMAR_CHARS)]
Key = Annotated[str, Field(max_length=MAX_KEY_CHARS)]
# the sampling parameters that constrain an answer, at most one a request
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")


def _integer_keys(value: Any) -> Any:
    """A logit_bias's keys as vLLM reads them (Python's int(): "12", " 12", "012"); "12.0",
    which a lax parse would read as 12, is refused as vLLM refuses it."""
    for key in value if isinstance(value, dict) else ():
        try:
            int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys are token ids (integers), got {key!r}") from None
    return value


# token id (a JSON key, so a string of digits) -> what is added to its logit; OpenAI's range,
# wide enough to force or ban a token (logits lie within a few tens)
LogitBias = Annotated[
    dict[TokenId, Annotated[float, Field(ge=-100, le=100)]] | None,
    Field(max_length=MAX_LOGIT_BIASES),
    BeforeValidator(_integer_keys),
]

# Fields of SGLang's SamplingParams and GenerateReqInput that change what a request does and
# that this server does not implement: accepted at their defaults (null, false, empty), refused
# with a 400 naming them otherwise. Why each is missing, for the message.
UNSUPPORTED_SAMPLING = {
    "custom_params": "custom logit processors are not run here",
    "beam_width": "beam search is not implemented",
    "watermark": "watermarking is not implemented",
    "choice": "use regex with an alternation of the choices",
}
UNSUPPORTED_REQUEST = {
    "custom_logit_processor": "this server does not run client-supplied code (custom logit processors)",
    "input_embeds": "prompts are text or token ids",
    "image_data": "the served models read text only",
    "video_data": "the served models read text only",
    "audio_data": "the served models read text only",
    "lora_path": "LoRA adapters are not supported",
    "lora_id": "LoRA adapters are not supported",
    "token_ids_logprob": "logprobs of chosen token ids are not computed (use top_logprobs_num)",
    "return_hidden_states": "hidden states are not returned",
    "return_routed_experts": "the served models have no experts",
    "return_entropy": "entropies are not returned",
    "return_prompt_token_ids": "prompt token ids are not returned (POST /tokenize gives them)",
    "session_params": "sessions are not supported (the radix cache shares prefixes without them)",
    "bootstrap_host": "prefill/decode disaggregation is not supported",
    "bootstrap_port": "prefill/decode disaggregation is not supported",
    "bootstrap_room": "prefill/decode disaggregation is not supported",
    "bootstrap_pair_key": "prefill/decode disaggregation is not supported",
}


def cache_namespace(cache_salt: str | None, extra_key: str | None) -> str | None:
    """A request's radix-cache namespace: its cache salt, keyed further by its extra key when
    it has one (SGLang keeps the two apart; so does the separator)."""
    salt, extra = cache_salt or None, extra_key or None
    return salt if extra is None else f"{extra}\x00{salt or ''}"


def check_generations(prompts: int, generations: int) -> None:
    """One request may expand into at most MAX_GENERATIONS generations (prompts x n)."""
    if generations > MAX_GENERATIONS:
        raise ValueError(
            f"{prompts} prompt(s) with their n make {generations} generations; at most {MAX_GENERATIONS} per request"
        )


def served_context(context_length: int | None) -> dict[str, Any]:
    """The validation context of a body read for a server of this context (None: not counted)."""
    return {"context_length": context_length}


def fits_context(items: Any, info: ValidationInfo, what: str = "items") -> Any:
    """Refuse a list of more ``what`` than the served context has tokens (each takes a token at
    least) before its items are read one by one: a 16 MB body of tiny items held the api's loop
    for over a second. The context is the validation's (``served_context``); a body read
    without one is not counted."""
    most = (info.context or {}).get("context_length")
    if most is not None and isinstance(items, list) and len(items) > most:
        raise ValueError(
            f"{len(items)} {what}; this model's context of {most} tokens holds fewer (each takes a token at least)"
        )
    return items


def is_prompt_batch(prompts: Any) -> bool:
    """Whether a prompt field holds several prompts (texts or token-id lists), not one."""
    return isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (list, str))


def prompts_fit_context(prompts: Any, info: ValidationInfo) -> Any:
    """A prompt, or a batch of prompts (each a text or token ids): a batch no longer than one
    request may generate from, and token ids that fit the context."""
    if not is_prompt_batch(prompts):
        return fits_context(prompts, info, "token ids")
    if len(prompts) > MAX_GENERATIONS:
        raise ValueError(f"{len(prompts)} prompts; at most {MAX_GENERATIONS} generations per request")
    for prompt in prompts:
        fits_context(prompt, info, "token ids")
    return prompts


def _is_default(value: Any, depth: int = 0) -> bool:
    """Null, false, zero or empty, also element-wise (SGLang's per-prompt lists). A number in a
    list of lists (an embedding's zeros), or a float anywhere, is data, never a default."""
    if isinstance(value, list):
        return all(_is_default(v, depth + 1) for v in value)
    number = value == 0 and value is not False and depth < 2 and not isinstance(value, float)
    return value is None or value is False or number or value in ({}, "")


def drop_unsupported(data: Any, unsupported: dict[str, str]) -> Any:
    """``data`` without the fields of ``unsupported`` that hold their default; ValueError
    naming the first one that does not."""
    if not isinstance(data, dict) or unsupported.keys().isdisjoint(data):
        return data  # the common case, found without a pass over ``unsupported``
    for name, why in unsupported.items():
        if not _is_default(data.get(name)):
            raise FieldError(name, f"{name} is not supported by this server: {why}")
    return {key: value for key, value in data.items() if key not in unsupported}


class SamplingParamsIn(BaseModel):
    """SGLang's ``sampling_params``; an unknown key is an error (most often a typo), as in SGLang."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    max_new_tokens: Count | None = None  # 0: prefill only (cache warm-up)
    min_new_tokens: Count = 0
    temperature: Temperature = 1.0
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX)
    min_p: float = Field(0.0, ge=0, le=1)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # accepted for SGLang's and vLLM's clients: their fast tokenizers, like this one, put no
    # spaces around special tokens either way
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, validation_alias=AliasChoices("seed", "sampling_seed"))
    regex: Grammar = None
    json_schema: Grammar = None
    ebnf: Grammar = None
    structural_tag: StructuralTag = None
    logit_bias: LogitBias = None
    stream_interval: int | None = Field(None, ge=1, le=INT32_MAX)

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        return drop_unsupported(data, UNSUPPORTED_SAMPLING)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (off) or at least 1")
        return value

    @field_validator("stop", "stop_regex")
    @classmethod
    def _stops_bounded(cls, value: str | list[str] | None, info: ValidationInfo) -> str | list[str] | None:
        stops = _as_list(value)
        most = MAX_STOP_STRINGS if info.field_name == "stop" else MAX_STOP_REGEXES
        if len(stops) > most:
            raise ValueError(f"at most {most} entries, got {len(stops)}")
        if any(len(stop) > MAX_STOP_CHARS for stop in stops):
            raise ValueError(f"an entry has at most {MAX_STOP_CHARS} characters")
        return value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_as_text(cls, value: Any) -> Any:
        # SGLang wants the schema as a string; a JSON object is the obvious thing to send too.
        return json.dumps(value) if isinstance(value, dict) else value

    @field_validator("stop_regex")
    @classmethod
    def _regexes_compile(cls, value: str | list[str] | None) -> str | list[str] | None:
        for pattern in [value] if isinstance(value, str) else value or []:
            try:
                regex.compile(pattern)  # the engine the router searches with
            except regex.error as exc:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParamsIn:
        grammars = [name for name in GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(grammars) > 1:
            names = f"{', '.join(GRAMMAR_FIELDS[:-1])} and {GRAMMAR_FIELDS[-1]}"
            raise FieldError(grammars[1], f"at most one of {names} may be set, got {' and '.join(grammars)}")
        tag = self.structural_tag_spec()
        if tag is not None and len(tag) > MAX_GRAMMAR_CHARS:
            raise FieldError("structural_tag", f"structural_tag is {len(tag)} characters, at most {MAX_GRAMMAR_CHARS}")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise FieldError("min_new_tokens", "min_new_tokens must not exceed max_new_tokens")
        return self

    def structural_tag_spec(self) -> str | None:
        """The structural tag's JSON text as the router compiles it."""
        return None if self.structural_tag is None else self.structural_tag.structural_tag_spec

    def to_protocol(
        self, default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, limit_name: str = "max_new_tokens"
    ) -> SamplingParams:
        """The router's parameters; ``limit_name``: the client's name of max_new_tokens."""
        return SamplingParams(
            max_new_tokens=default_max_new_tokens if self.max_new_tokens is None else self.max_new_tokens,
            max_new_tokens_is_default=self.max_new_tokens is None,
            max_new_tokens_name=limit_name,
            min_new_tokens=self.min_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=_as_list(self.stop),
            stop_token_ids=list(self.stop_token_ids or []),
            stop_regex=_as_list(self.stop_regex),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            no_stop_trim=self.no_stop_trim,
            seed=self.seed,
            regex=self.regex,
            json_schema=self.json_schema,
            ebnf=self.ebnf,
            structural_tag=self.structural_tag_spec(),
            logit_bias=dict(self.logit_bias or {}),
            stream_interval=self.stream_interval,
        )


def _as_list(value: str | list[str] | None) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def derive_rids(base: str | None, count: int) -> list[str]:
    """``count`` distinct request ids: ``base`` itself for one, ``base-i`` for several."""
    base = base or uuid.uuid4().hex
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]


def nth_sample(sampling: SamplingParams, index: int) -> SamplingParams:
    """The parameters of sample ``index`` of a prompt's ``n``: a seeded prompt's samples draw
    with seeds seed, seed + 1, ... (wrapping within int64, as vLLM seeds them), so they differ
    from each other and each repeats with the same seed."""
    if sampling.seed is None or index == 0:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index - INT64_MIN) % 2**64 + INT64_MIN)


# Per-prompt options that a batch may give as one value for all or as a list, one per prompt.
_PER_PROMPT = ("return_logprob", "top_logprobs_num", "logprob_start_len", "cache_salt", "extra_key")


def _item(value: Any, index: int) -> Any:
    return value[index] if isinstance(value, list) else value


class GenerateIn(BaseModel):
    """``POST /generate``: one prompt or a batch, SGLang's field names. Unknown top-level
    fields are ignored, as SGLang does (its clients send extras); fields SGLang knows and
    we do not implement are refused unless they hold their default."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    sampling_params: SamplingParamsIn | list[SamplingParamsIn] | None = None
    # Accepted at the top level as well: users send {"text": ..., "max_tokens": 64}.
    max_new_tokens: Count | None = None
    max_tokens: Count | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    top_logprobs_num: TopLogprobsNum | list[TopLogprobsNum] | None = None
    logprob_start_len: LogprobStart | list[LogprobStart] | None = None
    return_text_in_logprobs: bool = False
    rid: Key | list[Key] | None = None
    # both name a namespace of the radix cache: requests share prefixes only within one
    cache_salt: Key | list[Key] | None = None
    extra_key: Key | list[Key] | None = None
    deadline_s: Deadline = None
    gateway_tokens: GatewayTokensIn | None = None
    # SGLang's: under --reasoning-parser, a grammar holds only once the model's thinking has ended
    require_reasoning: bool = False

    _prompts_fit = field_validator("text", "input_ids", mode="before")(prompts_fit_context)

    @model_validator(mode="before")
    @classmethod
    def _supported(cls, data: Any) -> Any:
        return drop_unsupported(data, UNSUPPORTED_REQUEST)

    @model_validator(mode="after")
    def _one_input(self) -> GenerateIn:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of text and input_ids must be given")
        prompts = self.prompts()
        if not prompts:
            raise ValueError("the batch is empty")
        for i, prompt in enumerate(prompts):
            if len(prompt) == 0:
                where = f"prompt {i}" if self.is_batch else "the prompt"
                raise ValueError(f"{where} is empty")
        if self.gateway_tokens is not None:
            self.gateway_tokens.check_count(len(prompts))
        if isinstance(self.sampling_params, list):
            if not self.is_batch:
                raise FieldError("sampling_params", "sampling_params may be a list only for a batch of prompts")
            if len(self.sampling_params) != len(prompts):
                raise FieldError(
                    "sampling_params", f"{len(self.sampling_params)} sampling_params for {len(prompts)} prompts"
                )
        if isinstance(self.rid, list):
            if not self.is_batch or len(self.rid) != len(prompts):
                raise FieldError("rid", "rid may be a list only for a batch, with one id per prompt")
            if len(set(self.rid)) != len(self.rid):
                raise FieldError("rid", "the rids of a batch must be distinct")
        for name in _PER_PROMPT:
            value = getattr(self, name)
            if isinstance(value, list) and (not self.is_batch or len(value) != len(prompts)):
                raise FieldError(name, f"{name} may be a list only for a batch, with one value per prompt")
        check_generations(len(prompts), sum(self.params_for(i).n for i in range(len(prompts))))
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return any(isinstance(p, list) for p in self.input_ids or [])

    def prompts(self) -> list[str | list[int]]:
        if self.text is not None:
            return list(self.text) if isinstance(self.text, list) else [self.text]
        return [*id_prompts(self.input_ids or [])]

    def params_for(self, index: int) -> SamplingParamsIn:
        if isinstance(self.sampling_params, list):
            return self.sampling_params[index]
        return self.sampling_params or SamplingParamsIn()

    def returns_logprob(self, index: int) -> bool:
        return bool(_item(self.return_logprob, index))

    def cache_namespace(self, index: int) -> str | None:
        """The radix-cache namespace of prompt ``index``."""
        return cache_namespace(_item(self.cache_salt, index), _item(self.extra_key, index))

    def logprob_start(self, index: int) -> int:
        """Where prompt ``index``'s prompt logprobs start (-1: none asked for)."""
        return _or_default(_item(self.logprob_start_len, index), -1)

    def returns_list(self) -> bool:
        """SGLang answers a batch, or ``n > 1``, with a list."""
        return self.is_batch or any(self.params_for(i).n > 1 for i in range(len(self.prompts())))

    def expand(self, grammar_after: str | None = None) -> list[GenerateRequest]:
        """One GenerateRequest per prompt and sample, prompt-major (SGLang's order); a grammar
        holds only after the output writes ``grammar_after`` (the end of a model's thinking)."""
        given_max = next((v for v in (self.max_new_tokens, self.max_tokens) if v is not None), None)
        prompts = self.prompts()
        if isinstance(self.rid, list):
            bases = self.rid
        else:
            bases = derive_rids(self.rid, len(prompts))
        requests = []
        for i, prompt in enumerate(prompts):
            params = self.params_for(i)
            if given_max is not None and params.max_new_tokens is None:
                params = params.model_copy(update={"max_new_tokens": given_max})
            sampling = dataclasses.replace(params.to_protocol(), grammar_after=grammar_after)
            for sample, rid in enumerate(derive_rids(bases[i], params.n)):
                requests.append(
                    GenerateRequest(
                        rid=rid,
                        sampling=nth_sample(sampling, sample),
                        text=prompt if isinstance(prompt, str) else None,
                        input_ids=prompt if isinstance(prompt, list) else None,
                        stream=self.stream,
                        return_logprob=self.returns_logprob(i),
                        top_logprobs_num=_item(self.top_logprobs_num, i) or 0,
                        logprob_start_len=self.logprob_start(i),
                        return_text_in_logprobs=self.return_text_in_logprobs,
                        cache_salt=self.cache_namespace(i),
                        tokens=prompt_tokens(self.gateway_tokens, i),
                    )
                )
        return requests


def _or_default(value: int | None, default: int) -> int:
    return default if value is None else value


def id_prompts(ids: Sequence[int | list[int]]) -> list[list[int]]:
    """Token-id prompts given as one list of ids or as a batch of them (never mixed: the
    schema admits either shape, not both), as a batch."""
    batch = [p for p in ids if isinstance(p, list)]
    return batch or [[p for p in ids if isinstance(p, int)]]
