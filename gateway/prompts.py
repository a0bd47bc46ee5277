"""A request as the gateway routes it: validated with the replicas' own schemas (so a bad one
gets the same 400 here), expanded into its generations in response order, each tokenized the
way the router will (chat template included), salted as the router salts it (the tenant's
namespace) and limited the way the router limits a match. A warm or a pin is routed as the
generation of its prefix would be."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcluster.block_hash import ForgedSalt, tenant_salt
from radixcluster.gateway.segment_encoder import SegmentEncoder
from radixcluster.router.api.cache_schemas import CachePrefixIn, PinIn
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.gateway_tokens import pack_ids
from radixcluster.router.api.messages_schemas import MessagesIn
from radixcluster.router.api.native_schemas import GenerateIn, cache_namespace, served_context
from radixcluster.router.api.openai_schemas import ChatCompletionIn, CompletionIn
from radixcluster.router.api.responses_schemas import ResponsesIn
from radixcluster.router.text.prompt_text import prompt_text
from radixcluster.router.text.tokenizer import Tokenizer

NATIVE, COMPLETIONS, CHAT, RESPONSES, MESSAGES = "native", "completions", "chat", "responses", "messages"
# the chats under another shape (OpenAI's Responses API, Anthropic's Messages API): one answer,
# whose usage always comes with it, in typed events when streamed
CHAT_SHAPES: dict[str, type[ResponsesIn] | type[MessagesIn]] = {RESPONSES: ResponsesIn, MESSAGES: MessagesIn}
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
    ``usage_stride``: OpenAI's usage counts every ``n``-th of them (a prompt once);
    ``gateway_tokens``: the JSON of the field that hands the replica the ids of the body's text
    prompts (None when it has none)."""

    kind: str
    body: dict[str, Any]
    prompts: list[Prompt]
    stream: bool
    usage_stride: int = 1
    include_usage: bool = False
    gateway_tokens: bytes | None = None

    @property
    def tokens(self) -> int:
        return sum(len(p.ids) for p in self.prompts)

    def replica_body(self, raw: bytes, max_bytes: int) -> bytes:
        """``raw``, a JSON object, with ``gateway_tokens`` put first, so the replica does not
        tokenize the texts again (where the client spelled the field too, its own comes later
        and wins). A body in UTF-16 or 32, or with a byte order mark, goes as it came, and so
        does one that would grow past ``max_bytes``, the replica's limit."""
        if self.gateway_tokens is None or raw[:1] != b"{" or raw[1:2] == b"\x00":
            return raw
        body = b'{"gateway_tokens":' + self.gateway_tokens + b"," + raw[1:]
        return body if len(body) <= max_bytes else raw


def _prompt(ids: list[int] | np.ndarray, salt: str | None, logprob_start_len: int = -1) -> Prompt:
    arr = np.asarray(ids, dtype=np.int64)
    limit = len(arr) - 1
    if logprob_start_len >= 0:
        limit = min(limit, logprob_start_len)
    return Prompt(arr, salt, max(limit, 0))


class PromptReader:
    """Parses request bodies into RoutedRequests with the replicas' tokenizer."""

    def __init__(self, tokenizer: Tokenizer, context_length: int | None = None) -> None:
        self.tokenizer = tokenizer
        self._encoder = SegmentEncoder(tokenizer)
        # the model's context, which no replica's exceeds: a body with longer lists than it is
        # refused before they are read one by one (the schemas' validation context)
        self._validation = served_context(context_length)

    def _tokenize(self, given: list[str | list[int]]) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
        """Each prompt's ids, and the same with None for a prompt given as ids (a text that
        repeats in a batch is tokenized once)."""
        texts: dict[str, np.ndarray] = {}
        inputs: list[np.ndarray] = []
        tokenized: list[np.ndarray | None] = []
        for prompt in given:
            if isinstance(prompt, str):
                if prompt not in texts:
                    texts[prompt] = self._encode(prompt)
                ids = texts[prompt]
                tokenized.append(ids)
            else:
                ids = np.asarray(prompt, dtype=np.int64)
                tokenized.append(None)
            inputs.append(ids)
        return inputs, tokenized

    def _gateway_tokens(self, tokenized: list[np.ndarray | None]) -> bytes | None:
        """The ``gateway_tokens`` field of a request whose prompts tokenized as ``tokenized``
        (None for a prompt given as ids)."""
        if all(ids is None for ids in tokenized):
            return None
        packed = [None if ids is None else pack_ids(ids) for ids in tokenized]
        return json.dumps({"tokenizer": self.tokenizer.fingerprint, "prompts": packed}).encode()

    def _encode(
        self,
        text: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> np.ndarray:
        """The ids of a text, or of a chat given as its GenerateRequest's fields."""
        try:
            rendered, add_special = prompt_text(
                self.tokenizer, text, messages, continue_final_message, tools, chat_template_kwargs
            )
        except ValueError as exc:
            raise ApiError(400, f"invalid chat messages: {exc}") from exc
        return np.asarray(self._encoder.encode(rendered, add_special), dtype=np.int64)

    def read(self, kind: str, body: dict[str, Any], tenant: str | None = None) -> RoutedRequest:
        """Validate ``body`` (raises pydantic's ValidationError or ApiError, both a 400) sent
        with the key of ``tenant``, if any."""
        routed = self._read(kind, body)
        try:
            for prompt in routed.prompts:
                prompt.salt = tenant_salt(tenant, prompt.salt)
        except ForgedSalt as exc:
            raise ApiError(400, str(exc)) from None
        return routed

    def _read(self, kind: str, body: dict[str, Any]) -> RoutedRequest:
        if kind in CACHE_KINDS:
            prefix = CACHE_KINDS[kind].model_validate(body, context=self._validation)
            prefix_ids = prefix.input_ids if prefix.input_ids is not None else self._encode(prefix.text)
            return RoutedRequest(kind, body, [_prompt(prefix_ids, prefix.cache_salt)], stream=False)
        if kind == NATIVE:
            native = GenerateIn.model_validate(body, context=self._validation)
            inputs, tokenized = self._tokenize(native.prompts())
            prompts = []
            # the order of native.expand() (prompt-major, each prompt n times), without the
            # request ids and sampling parameters it makes for the router
            for i, ids in enumerate(inputs):
                salt, start = native.cache_namespace(i), native.logprob_start(i)
                prompts += [_prompt(ids, salt, start) for _ in range(native.params_for(i).n)]
            return RoutedRequest(kind, body, prompts, native.stream, gateway_tokens=self._gateway_tokens(tokenized))
        if kind == COMPLETIONS:
            completion = CompletionIn.model_validate(body, context=self._validation)
            inputs, tokenized = self._tokenize(completion.prompts())
            start = 0 if completion.prompt_logprobs else -1  # echo with logprobs scores the whole prompt
            salt = cache_namespace(completion.cache_salt, completion.extra_key)
            prompts = [_prompt(ids, salt, start) for ids in inputs for _ in range(completion.n)]
            stride, usage, field = completion.n, completion.include_usage, self._gateway_tokens(tokenized)
            return RoutedRequest(kind, body, prompts, completion.stream, stride, usage, gateway_tokens=field)
        if kind in CHAT_SHAPES:
            shaped = CHAT_SHAPES[kind].model_validate(body, context=self._validation)
            ids = self._encode(**shaped.chat_input())
            prompts = [_prompt(ids, cache_namespace(shaped.cache_salt, shaped.extra_key))]
            return RoutedRequest(kind, body, prompts, shaped.stream, 1, True, self._gateway_tokens([ids]))
        chat = ChatCompletionIn.model_validate(body, context=self._validation)
        ids = self._encode(**chat.chat_input())
        prompts = [_prompt(ids, cache_namespace(chat.cache_salt, chat.extra_key)) for _ in range(chat.n)]
        field = self._gateway_tokens([ids])
        return RoutedRequest(kind, body, prompts, chat.stream, chat.n, chat.include_usage, gateway_tokens=field)
