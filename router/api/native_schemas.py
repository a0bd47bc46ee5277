"""Pydantic models of SGLang's native ``/generate`` request, and their expansion into one
protocol GenerateRequest per prompt and sample."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from radixcluster.protocol import GenerateRequest, SamplingParams

DEFAULT_MAX_NEW_TOKENS = 128

TokenId = Annotated[int, Field(ge=0)]


class SamplingParamsIn(BaseModel):
    """SGLang's ``sampling_params``; an unknown key is an error (most often a typo)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_new_tokens: int | None = Field(None, ge=0)  # 0: prefill only (cache warm-up)
    min_new_tokens: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1
    min_p: float = Field(0.0, ge=0, le=1)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = Field(1, ge=1, le=64)
    seed: int | None = Field(None, validation_alias=AliasChoices("seed", "sampling_seed"))
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (off) or at least 1")
        return value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _schema_as_text(cls, value: Any) -> Any:
        # SGLang wants the schema as a string; a JSON object is the obvious thing to send too.
        return json.dumps(value) if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _consistent(self) -> SamplingParamsIn:
        grammars = [name for name in ("regex", "json_schema", "ebnf") if getattr(self, name) is not None]
        if len(grammars) > 1:
            raise ValueError(f"at most one of regex, json_schema and ebnf may be set, got {' and '.join(grammars)}")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must not exceed max_new_tokens")
        return self

    def to_protocol(self, default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            max_new_tokens=default_max_new_tokens if self.max_new_tokens is None else self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            no_stop_trim=self.no_stop_trim,
            seed=self.seed,
            regex=self.regex,
            json_schema=self.json_schema,
            ebnf=self.ebnf,
        )


def derive_rids(base: str | None, count: int) -> list[str]:
    """``count`` distinct request ids: ``base`` itself for one, ``base-i`` for several."""
    base = base or uuid.uuid4().hex
    return [base] if count == 1 else [f"{base}-{i}" for i in range(count)]


class GenerateIn(BaseModel):
    """``POST /generate``: one prompt or a batch, SGLang's field names. Unknown top-level
    fields are ignored (SGLang clients send extras)."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    sampling_params: SamplingParamsIn | list[SamplingParamsIn] | None = None
    # Accepted at the top level as well: users send {"text": ..., "max_tokens": 64}.
    max_new_tokens: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(0, ge=0, le=20)
    logprob_start_len: int = Field(-1, ge=-1)
    rid: str | list[str] | None = None
    cache_salt: str | None = None

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
        if isinstance(self.sampling_params, list):
            if not self.is_batch:
                raise ValueError("sampling_params may be a list only for a batch of prompts")
            if len(self.sampling_params) != len(prompts):
                raise ValueError(f"{len(self.sampling_params)} sampling_params for {len(prompts)} prompts")
        if isinstance(self.rid, list):
            if not self.is_batch or len(self.rid) != len(prompts):
                raise ValueError("rid may be a list only for a batch, with one id per prompt")
            if len(set(self.rid)) != len(self.rid):
                raise ValueError("the rids of a batch must be distinct")
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

    def returns_list(self) -> bool:
        """SGLang answers a batch, or ``n > 1``, with a list."""
        return self.is_batch or any(self.params_for(i).n > 1 for i in range(len(self.prompts())))

    def expand(self) -> list[GenerateRequest]:
        """One GenerateRequest per prompt and sample, prompt-major (SGLang's order)."""
        default_max = next((v for v in (self.max_new_tokens, self.max_tokens) if v is not None), DEFAULT_MAX_NEW_TOKENS)
        prompts = self.prompts()
        if isinstance(self.rid, list):
            bases = self.rid
        else:
            bases = derive_rids(self.rid, len(prompts))
        requests = []
        for i, prompt in enumerate(prompts):
            params = self.params_for(i)
            sampling = params.to_protocol(default_max)
            for rid in derive_rids(bases[i], params.n):
                requests.append(
                    GenerateRequest(
                        rid=rid,
                        sampling=sampling,
                        text=prompt if isinstance(prompt, str) else None,
                        input_ids=prompt if isinstance(prompt, list) else None,
                        stream=self.stream,
                        return_logprob=self.return_logprob,
                        top_logprobs_num=self.top_logprobs_num,
                        logprob_start_len=self.logprob_start_len,
                        cache_salt=self.cache_salt,
                    )
                )
        return requests


def id_prompts(ids: Sequence[int | list[int]]) -> list[list[int]]:
    """Token-id prompts given as one list of ids or as a batch of them (never mixed: the
    schema admits either shape, not both), as a batch."""
    batch = [p for p in ids if isinstance(p, list)]
    return batch or [[p for p in ids if isinstance(p, int)]]
