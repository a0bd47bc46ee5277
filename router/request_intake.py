"""Turn an api GenerateRequest into a scheduler Request: render the chat, tokenize, and reject
what cannot run (with a message that says why; the api answers it as a 400). The request's grammar,
if any, is the router's to compile."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixcluster.block_hash import ForgedSalt, tenant_salt
from radixcluster.protocol import FLOAT32_MAX, INT32_MAX, INT64_MAX, INT64_MIN, GenerateRequest, PromptPin, PromptTokens
from radixcluster.router.request import Request
from radixcluster.router.text.prompt_memo import PromptMemo
from radixcluster.router.text.prompt_text import prompt_text
from radixcluster.router.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class RequestRejected(ValueError):
    """The client's request cannot run; the message is for the client, ``param`` the field it
    blames by the client's name (OpenAI's ``param``), when the router knows it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class RequestIntake:
    """``pool_tokens``: the KV pool's size; a request's prompt + output must fit it whole (and the
    context), or it could never run even alone. ``auto_truncate`` (SGLang's --allow-auto-truncate):
    a prompt over the context keeps its beginning, and an output limit over the room is lowered.

    Tokenizing runs on the router's loop, so a text is refused unread when it is too long to be
    any prompt: no token stands for more than the tokenizer's longest entry, so a text of more
    than ``max_text_chars`` characters has more tokens than the context holds."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, context_length: int, pool_tokens: int, auto_truncate: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.pool_tokens = pool_tokens
        self.auto_truncate = auto_truncate
        self.max_text_chars = context_length * tokenizer.longest_token_chars()
        self.memo = PromptMemo()
        # the text encoded last and its ids: the n samples of one prompt arrive one after another
        self._last: tuple[str | None, str, bool, np.ndarray] | None = None  # salt, text, add_special, ids

    def check_text(self, text: str, what: str = "the prompt") -> None:
        """RequestRejected when ``text`` is longer than any prompt can be."""
        if len(text) > self.max_text_chars:
            raise RequestRejected(
                f"{what} has {len(text)} characters; no text of more than {self.max_text_chars} characters fits "
                f"this model's context of {self.context_length} tokens"
            )

    def check_chat(self, messages: list[dict[str, Any]]) -> None:
        """RequestRejected when a chat has more messages than any prompt can hold (each takes a
        token at least), before its template renders them: ~3 us a message on the router's
        loop, which holds every other request up meanwhile (a 16 MB body of 450,000 one-letter
        messages took ~1.5 s)."""
        if len(messages) > self.context_length:
            raise RequestRejected(
                f"the chat has {len(messages)} messages; this model's context of {self.context_length} tokens "
                "holds fewer (every message takes a token at least)"
            )

    def prompt(self, msg: GenerateRequest) -> tuple[str | None, np.ndarray]:
        """The prompt's text (None for input_ids) and token ids; a chat is rendered with the
        model's template first. A text that extends one the router produced whole (an earlier
        prompt + answer) keeps that text's ids and encodes only the rest."""
        if msg.input_ids is not None:
            return None, _token_ids(msg.input_ids, "input_ids")
        if msg.messages is None and msg.text is None:
            raise RequestRejected("one of text, input_ids or messages is required")
        if msg.messages is not None:
            self.check_chat(msg.messages)
        try:
            text, add_special = prompt_text(
                self.tokenizer, msg.text, msg.messages, msg.continue_final_message, msg.tools, msg.chat_template_kwargs
            )
        except ValueError as exc:
            raise RequestRejected(f"invalid chat messages: {exc}") from exc
        self.check_text(text)
        salt = _salt(msg)
        if self._last is not None and self._last[:3] == (salt, text, add_special):
            return text, self._last[3]
        ids = self._encode(text, add_special, msg.tokens, salt)
        self._last = (salt, text, add_special, ids)
        return text, ids

    def encode(self, text: str, add_special: bool) -> list[int]:
        """``text``'s ids as a prompt's are made, the memo's first: what /tokenize and the
        count endpoints answer, so that they count what the chat would run."""
        return self._encode(text, add_special, None, None).tolist()

    def _encode(self, text: str, add_special: bool, given: PromptTokens | None, salt: str | None) -> np.ndarray:
        """The memo's ids first (those remembered under the request's salt; the gateway in
        front has no memo), then the gateway's ids if its tokenizer is this one, else the
        tokenizer's."""
        known = self.memo.longest_prefix(text, salt)
        if known is not None and not self.tokenizer.splits_at(text, len(known[0])):
            known = None  # the text goes on inside its last piece ("mountain" + "s"): encoded whole
        if known is None and given is not None and given.tokenizer == self.tokenizer.fingerprint:
            return given.ids.astype(np.int64)
        if known is None:
            return np.asarray(self.tokenizer.encode(text, add_special_tokens=add_special), dtype=np.int64)
        known_text, known_ids = known
        rest = self.tokenizer.encode(text[len(known_text) :], add_special_tokens=False)
        return np.concatenate([known_ids, np.asarray(rest, dtype=np.int32)]).astype(np.int64)

    def make_request(self, msg: GenerateRequest) -> tuple[Request, str | None]:
        """The scheduler's request (without its grammar) and the prompt's text (for the memo once
        it finishes)."""
        _check_integers(msg)
        _check_floats(msg)
        sampling = msg.sampling
        text, whole = self.prompt(msg)
        ids = self._truncated(msg, whole.reshape(-1))
        if ids.size < whole.size:
            text = None  # its ids are no longer the text's: nothing for the memo
        if ids.size == 0:
            raise RequestRejected("the prompt is empty: at least one token is needed")
        self._check_ids(ids, "input_ids")
        if ids.size >= self.room_tokens:
            # Anthropic's wording, which Claude Code reads to know how much of a conversation to compact
            raise RequestRejected(
                f"prompt is too long: {ids.size} tokens > {self.room_tokens - 1} maximum ({self._room()})"
            )
        if sampling.max_new_tokens_is_default or self.auto_truncate:
            # a limit the client did not set (or any, with auto-truncation) gives way to the room the prompt leaves
            room = self.room_tokens - int(ids.size)
            if 0 < room < sampling.max_new_tokens:
                sampling = dataclasses.replace(sampling, max_new_tokens=room)
        self._check_fits(int(ids.size), sampling.max_new_tokens, sampling.max_new_tokens_name)
        salt = _salt(msg)
        if sampling.stop_token_ids:
            # as SGLang and vLLM: an id past the vocabulary is never sampled, so it stops nothing
            # (SGLang's own test kits send 119690 to every model)
            stops = _token_ids(sampling.stop_token_ids, "stop_token_ids")
            kept = stops[(stops >= 0) & (stops < self.vocab_size)]
            if kept.size < stops.size:
                sampling = dataclasses.replace(sampling, stop_token_ids=kept.tolist())
        if sampling.logit_bias:
            self._check_ids(_token_ids(list(sampling.logit_bias), "logit_bias"), "logit_bias")
            _check_biases(list(sampling.logit_bias.values()))
        request = Request(
            rid=msg.rid,
            prompt_ids=ids.astype(np.int32),
            sampling=sampling,
            eos_token_ids=self.tokenizer.eos_token_ids,
            cache_salt=salt,
            tenant=msg.tenant,
            log_metrics=msg.log_metrics,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            logprob_start_len=_logprob_start(msg.logprob_start_len, int(ids.size)),
            pins=[(self._pin_prefix(msg, pin, ids), pin.ttl_s) for pin in msg.pins],
        )
        return request, text

    def _truncated(self, msg: GenerateRequest, ids: np.ndarray) -> np.ndarray:
        """The prompt's ids after vLLM's truncate_prompt_tokens (its last ones kept) and SGLang's
        --allow-auto-truncate (its first ones, one token of room left)."""
        keep = msg.truncate_prompt_tokens
        if keep is not None:
            if not -1 <= keep <= self.context_length:
                raise RequestRejected(
                    f"truncate_prompt_tokens must be -1 (the context's length) or at most this model's context "
                    f"length of {self.context_length}, got {keep}"
                )
            limit = self.context_length if keep == -1 else keep
            if ids.size > limit and any(pin.messages is not None for pin in msg.pins):
                raise RequestRejected("truncate_prompt_tokens cuts the chat's beginning, where cache_control pins it")
            ids = ids[ids.size - limit :] if limit < ids.size else ids
        if self.auto_truncate and ids.size >= self.room_tokens:
            logger.warning(
                "a prompt of %d tokens leaves no room (%s): its first %d are kept",
                ids.size,
                self._room(),
                self.room_tokens - 1,
            )
            ids = ids[: self.room_tokens - 1]
        return ids

    @property
    def room_tokens(self) -> int:
        """The most tokens one request's prompt + output may hold: the context's, or the KV
        pool's where it is smaller (it may be, sized from memory: SGLang caps prompts by both)."""
        return min(self.context_length, self.pool_tokens)

    def _room(self) -> str:
        """What bounds a request's tokens, for a refusal's message."""
        context = f"this model's context length is {self.context_length}"
        if self.pool_tokens < self.context_length:
            return f"{context}, and the KV pool holds {self.pool_tokens} tokens; prompt + output must fit"
        return f"{context}; prompt + output must fit"

    def _pin_prefix(self, msg: GenerateRequest, pin: PromptPin, ids: np.ndarray) -> np.ndarray:
        """The token ids a pin names: the whole prompt, or its chat's first ``pin.messages``
        messages rendered as the template renders them inside the whole chat."""
        if not pin.ttl_s > 0:
            raise RequestRejected(f"a pin's ttl must be positive, got {pin.ttl_s}")
        if pin.messages is None:
            return ids.astype(np.int32)
        if msg.messages is None or not 1 <= pin.messages <= len(msg.messages):
            raise RequestRejected(f"a pin names {pin.messages} messages of a chat of {len(msg.messages or [])}")
        text = self.tokenizer.apply_chat_template(
            msg.messages[: pin.messages], False, msg.tools, template_kwargs=msg.chat_template_kwargs
        )
        return self._encode(text, False, None, _salt(msg)).astype(np.int32)

    def _check_fits(self, prompt_len: int, max_new_tokens: int, name: str) -> None:
        """``name``: the client's name of max_new_tokens."""
        total = prompt_len + max_new_tokens
        for limit, what in ((self.context_length, "this model's context length"), (self.pool_tokens, "the KV pool")):
            if total > limit:
                raise RequestRejected(
                    f"the prompt ({prompt_len} tokens) + {name} ({max_new_tokens}) = {total} tokens "
                    f"exceed {what} of {limit} tokens: lower {name} or shorten the prompt",
                    name,
                )

    def _check_ids(self, ids: np.ndarray, what: str) -> None:
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise RequestRejected(
                f"{what} holds token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5].tolist()}",
                _param(what),
            )


def _salt(msg: GenerateRequest) -> str | None:
    """The salt its prompt's cache (and the memo's texts) live under: its tenant's and its own."""
    try:
        return tenant_salt(msg.tenant, msg.cache_salt)
    except ForgedSalt as exc:
        raise RequestRejected(str(exc)) from None


def _token_ids(values: Sequence[int], what: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        raise RequestRejected(f"{what} holds a value that is no token id", _param(what)) from None


def _logprob_start(start: int, prompt_len: int) -> int:
    """The first prompt position whose logprob is returned (-1: none), as SGLang reads
    ``logprob_start_len``: the prompt's length asks for none, a start past it is refused."""
    if start > prompt_len:
        raise RequestRejected(
            f"logprob_start_len ({start}) is past the prompt's {prompt_len} tokens: use a smaller one",
            "logprob_start_len",
        )
    return -1 if start == prompt_len else start


def _param(what: str) -> str | None:
    """The field a rejection of ``what`` blames: the prompt's ids are each endpoint's own field."""
    return None if what == "input_ids" else what


def _check_biases(values: list[float]) -> None:
    try:
        finite = bool(np.isfinite(np.asarray(values, dtype=np.float64)).all())
    except (TypeError, ValueError):
        finite = False
    if not finite:
        raise RequestRejected("logit_bias values must be finite numbers", "logit_bias")


def _check_floats(msg: GenerateRequest) -> None:
    """The sampling floats' ranges, as the api's schemas hold them (nan is in none): a message
    from any other client (the offline ``generate``) must not sample from a negative temperature
    as if it were greedy."""
    s = msg.sampling
    ranges = {  # name: value, low, high, whether low itself is allowed
        "temperature": (s.temperature, 0.0, FLOAT32_MAX, True),
        "top_p": (s.top_p, 0.0, 1.0, False),
        "min_p": (s.min_p, 0.0, 1.0, True),
        "frequency_penalty": (s.frequency_penalty, -2.0, 2.0, True),
        "presence_penalty": (s.presence_penalty, -2.0, 2.0, True),
        "repetition_penalty": (s.repetition_penalty, 0.0, 2.0, False),
    }
    for name, (value, low, high, closed) in ranges.items():
        if not ((low <= value) if closed else (low < value)) or not value <= high:
            raise RequestRejected(f"{name} must be within {'[' if closed else '('}{low:g}, {high:g}], got {value}")


def _check_integers(msg: GenerateRequest) -> None:
    """The integer ranges the batch builder's arrays hold (the api checks them first; a message
    from any other client must not reach a step)."""
    s = msg.sampling
    ranges = {
        "top_logprobs_num": (msg.top_logprobs_num, 0, INT32_MAX),
        "logprob_start_len": (msg.logprob_start_len, -1, INT32_MAX),
        "max_new_tokens": (s.max_new_tokens, 0, INT32_MAX),
        "min_new_tokens": (s.min_new_tokens, 0, INT32_MAX),
        "top_k": (s.top_k, -1, INT32_MAX),
        "seed": (-1 if s.seed is None else s.seed, INT64_MIN, INT64_MAX),
    }
    for name, (value, low, high) in ranges.items():
        if not low <= value <= high:
            raise RequestRejected(f"{name} must be within [{low}, {high}], got {value}")
