"""Turn an api GenerateRequest into a scheduler Request: render the chat, tokenize, compile its
grammar, and reject what cannot run (with a message that says why; the api answers it as a 400)."""

from __future__ import annotations

import numpy as np

from radixcluster.protocol import GenerateRequest
from radixcluster.router.grammar import GrammarCache, GrammarError
from radixcluster.router.request import Request
from radixcluster.router.text.prompt_memo import PromptMemo
from radixcluster.router.text.prompt_text import prompt_text
from radixcluster.router.text.tokenizer import Tokenizer


class RequestRejected(ValueError):
    """The client's request cannot run; the message is for the client."""


class RequestIntake:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.grammars = GrammarCache(tokenizer, vocab_size)
        self.memo = PromptMemo()

    def prompt(self, msg: GenerateRequest) -> tuple[str | None, np.ndarray]:
        """The prompt's text (None for input_ids) and token ids; a chat is rendered with the
        model's template first. A text that extends one the router produced whole (an earlier
        prompt + answer) keeps that text's ids and encodes only the rest."""
        if msg.input_ids is not None:
            return None, np.asarray(msg.input_ids, dtype=np.int64)
        if msg.messages is None and msg.text is None:
            raise RequestRejected("one of text, input_ids or messages is required")
        try:
            text, add_special = prompt_text(self.tokenizer, msg.text, msg.messages)
        except ValueError as exc:
            raise RequestRejected(f"invalid chat messages: {exc}") from exc
        known = self.memo.longest_prefix(text)
        if known is None:
            return text, np.asarray(self.tokenizer.encode(text, add_special_tokens=add_special), dtype=np.int64)
        known_text, known_ids = known
        rest = self.tokenizer.encode(text[len(known_text) :], add_special_tokens=False)
        return text, np.concatenate([known_ids, np.asarray(rest, dtype=np.int32)]).astype(np.int64)

    def make_request(self, msg: GenerateRequest) -> tuple[Request, str | None]:
        """The scheduler's request and the prompt's text (for the memo once it finishes)."""
        text, ids = self.prompt(msg)
        ids = ids.reshape(-1)
        if ids.size == 0:
            raise RequestRejected("the prompt is empty: at least one token is needed")
        self._check_ids(ids, "input_ids")
        if ids.size >= self.context_length:
            raise RequestRejected(
                f"the prompt has {ids.size} tokens; this model's context length is {self.context_length} "
                f"(prompt + output must fit)"
            )
        sampling = msg.sampling
        if sampling.stop_token_ids:
            self._check_ids(np.asarray(sampling.stop_token_ids, dtype=np.int64), "stop_token_ids")
        try:
            # compiled here, before the scheduler sees it: a new spec costs milliseconds, a known one nothing
            grammar = self.grammars.for_request(sampling)
        except GrammarError as exc:
            raise RequestRejected(str(exc)) from exc
        request = Request(
            rid=msg.rid,
            prompt_ids=ids.astype(np.int32),
            sampling=sampling,
            eos_token_ids=self.tokenizer.eos_token_ids,
            cache_salt=msg.cache_salt,
            return_logprob=msg.return_logprob,
            top_logprobs_num=msg.top_logprobs_num,
            logprob_start_len=min(msg.logprob_start_len, int(ids.size) - 1),
            grammar=grammar,
        )
        return request, text

    def _check_ids(self, ids: np.ndarray, what: str) -> None:
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise RequestRejected(
                f"{what} holds token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5].tolist()}"
            )
