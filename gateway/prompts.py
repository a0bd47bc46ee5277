"""A request as the gateway routes it: validated with the replicas' own schemas (so a bad one
gets the same 400 here), expanded into its generations in response order, each tokenized the
way the router will (chat template included), salted as the router salts it (the tenant's
namespace) and limited the way the router limits a match. A warm or a pin is routed as the
generation of its prefix would be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcluster.block_hash import ForgedSalt, tenant_salt
from radixcluster.gateway.segment_encoder import SegmentEncoder
from radixcluster.router.api.cache_schemas import CachePrefixIn, PinIn
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.native_schemas import GenerateIn
from radixcluster.router.api.openai_schemas import ChatCompletionIn, CompletionIn
from radixcluster.router.text.prompt_text import prompt_text
from radixcluster.router.text.tokenizer import Tokenizer

NATIVE, COMPLETIONS, CHAT = "native", "completions", "chat"
# POST /cache/warm and /cache/pin: one prompt, answered with a native meta_info's counts at the top
WARM, PIN = "warm", "pin"
CACHE_KINDS: dict[str, type[CachePrefixIn]] = {WARM: CachePrefixIn, PIN: PinIn}


@dataclass(slots=True)
class Prompt:
    """One generation's prompt: its ids, its cache salt, and how many of its leading tokens
    the router may reuse (all but the last; not past the first prompt logprob asked for)."""

    ids: np.ndarray
    salt: str | None
    match_limit: int


@dataclass(slots=True)
class RoutedRequest:
    """``prompts`` in the order of the response (a batch's prompts, each ``n`` times);
    ``usage_stride``: OpenAI's usage counts every ``n``-th of them (a prompt once)."""

    kind: str
    body: dict[str, Any]
    prompts: list[Prompt]
    stream: bool
    usage_stride: int = 1
    include_usage: bool = False

    @property
    def tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)


def _prompt(ids: list[int] | np.ndarray, salt: str | None, logprob_start_len: int = -1) -> Prompt:
    arr = np.asarray(ids, dtype=np.int64)
    limit = len(arr) - 1
    if logprob_start_len >= 0:
        limit = min(limit, logprob_start_len)
    return Prompt(arr, salt, max(limit, 0))


class PromptReader:
    """Parses request bodies into RoutedRequests with the replicas' tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._encoder = SegmentEncoder(tokenizer)

    def _encode(self, text: str | None = None, messages: list[dict[str, Any]] | None = None) -> list[int]:
        try:
            rendered, add_special = prompt_text(self.tokenizer, text, messages)
        except ValueError as exc:
            raise ApiError(400, f"invalid chat messages: {exc}") from exc
        return self._encoder.encode(rendered, add_special)

    def read(self, kind: str, body: Any, tenant: str | None = None) -> RoutedRequest:
        """Validate ``body`` (raises pydantic's ValidationError or ApiError, both a 400) sent
        with the key of ``tenant``, if any."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        routed = self._read(kind, body)
        try:
            for prompt in routed.prompts:
                prompt.salt = tenant_salt(tenant, prompt.salt)
        except ForgedSalt as exc:
            raise ApiError(400, str(exc)) from None
        return routed

    def _read(self, kind: str, body: dict[str, Any]) -> RoutedRequest:
        if kind in CACHE_KINDS:
            prefix = CACHE_KINDS[kind].model_validate(body)
            prefix_ids = prefix.input_ids if prefix.input_ids is not None else self._encode(prefix.text)
            return RoutedRequest(kind, body, [_prompt(prefix_ids, prefix.cache_salt)], stream=False)
        if kind == NATIVE:
            native = GenerateIn.model_validate(body)
            texts: dict[str, list[int]] = {}
            prompts = []
            # the order of native.expand() (prompt-major, each prompt n times), without the
            # request ids and sampling parameters it makes for the router
            for i, prompt in enumerate(native.prompts()):
                if isinstance(prompt, str):
                    ids = texts.get(prompt) or texts.setdefault(prompt, self._encode(prompt))
                else:
                    ids = prompt
                salt, start = native.cache_namespace(i), native.logprob_start(i)
                prompts += [_prompt(ids, salt, start) for _ in range(native.params_for(i).n)]
            return RoutedRequest(kind, body, prompts, native.stream)
        if kind == COMPLETIONS:
            completion = CompletionIn.model_validate(body)
            inputs = [p if isinstance(p, list) else self._encode(p) for p in completion.prompts()]
            prompts = [_prompt(ids, completion.cache_salt) for ids in inputs for _ in range(completion.n)]
            return RoutedRequest(kind, body, prompts, completion.stream, completion.n, completion.include_usage)
        chat = ChatCompletionIn.model_validate(body)
        ids = self._encode(messages=[m.as_dict() for m in chat.messages])
        prompts = [_prompt(ids, chat.cache_salt) for _ in range(chat.n)]
        return RoutedRequest(kind, body, prompts, chat.stream, chat.n, chat.include_usage)
