"""A generation request inside the router: its tokens, its lifecycle and its KV bookkeeping."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from radixcluster.protocol import SamplingParams

if TYPE_CHECKING:
    from radixcluster.router.grammar import RequestGrammar


class ReqState(enum.Enum):
    WAITING = "waiting"  # in the queue (new, or retracted)
    PREFILLING = "prefilling"  # admitted, prefill not finished (the chunked request)
    RUNNING = "running"  # decoding
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    """One request. ``finish_reason`` uses SGLang's shapes: ``{"type": "stop", "matched": id}``,
    ``{"type": "length", "length": n}``, ``{"type": "abort", "message": text}``."""

    rid: str
    prompt_ids: np.ndarray
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: tuple[int, ...] = ()
    cache_salt: str | None = None
    tenant: str | None = None  # counted under this tenant (its cache_salt already names it)
    log_metrics: bool = True  # false: a probe of the server's own, in no counter
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # first prompt position whose logprob is wanted; -1: none
    logprob_start_len: int = -1
    # regex / json_schema / ebnf / structural_tag matcher; None: unconstrained
    grammar: RequestGrammar | None = None
    # prefixes of the prompt to pin once it is computed: (token ids, ttl in seconds)
    pins: list[tuple[np.ndarray, float]] = field(default_factory=list)

    state: ReqState = field(default=ReqState.WAITING, init=False)
    output_ids: list[int] = field(default_factory=list, init=False)
    finish_reason: dict[str, Any] | None = field(default=None, init=False)
    # prefix tokens reused from the cache at first admission (never recounted after a retraction)
    cached_tokens: int = field(default=0, init=False)
    admitted_once: bool = field(default=False, init=False)
    retractions: int = field(default=0, init=False)
    pinned_tokens: int = field(default=0, init=False)  # what its pins hold (refused ones: nothing)
    group_losses: int = field(default=0, init=False)  # TP groups lost while it was admitted
    # per output token when return_logprob: [logprob, token id, [[top logprob, top id], ...]]
    output_logprobs: list[list[Any]] = field(default_factory=list, init=False)
    # input_logprobs[i]: logprob of prompt token logprob_start_len + 1 + i (complete after prefill)
    input_logprobs: list[float | None] = field(default_factory=list, init=False)
    # beside input_logprobs when top_logprobs_num > 0: [[top logprob, top id], ...] or None
    input_top_logprobs: list[list[list[Any]] | None] = field(default_factory=list, init=False)
    input_logprob_next: int = field(default=0, init=False)  # next prompt position to score

    # KV state, valid while admitted. pages[i] holds tokens [i * P, (i + 1) * P).
    slot: int = field(default=-1, init=False)
    pages: list[int] = field(default_factory=list, init=False)
    num_computed: int = field(default=0, init=False)  # tokens whose KV is written
    tree_len: int = field(default=0, init=False)  # leading tokens on pages the tree owns (locked)
    last_node: Any = field(default=None, init=False)  # the locked RadixTree node
    synced_pages: int = field(default=0, init=False)  # table entries the worker has right
    admit_seq: int = field(default=-1, init=False)

    prompt_len: int = field(default=0, init=False)
    float_row: tuple[float, ...] = field(default=(), init=False)
    int_row: tuple[int, ...] = field(default=(), init=False)
    has_penalty: bool = field(default=False, init=False)
    # the distinct prompt tokens the repetition penalty covers (none when it is 1)
    prompt_vocab: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32), init=False)
    bias_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32), init=False)
    bias_values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), init=False)
    # the biases while it has fewer than min_new_tokens: -inf on the tokens that would end it
    early_bias_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32), init=False)
    early_bias_values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), init=False)

    def __post_init__(self) -> None:
        self.prompt_ids = np.ascontiguousarray(self.prompt_ids, dtype=np.int32).reshape(-1)
        if self.prompt_ids.size == 0:
            raise ValueError(f"request {self.rid}: empty prompt")
        self.prompt_len = int(self.prompt_ids.size)
        s = self.sampling
        if s.max_new_tokens < 0:
            raise ValueError(f"request {self.rid}: max_new_tokens must be >= 0")
        self.eos_token_ids = tuple(self.eos_token_ids)
        self.input_logprob_next = self.logprob_start_len if self.logprob_start_len >= 0 else self.prompt_len
        # sampling rows are built once: a decode step only stacks them
        self.float_row = (
            s.temperature,
            s.top_p,
            s.min_p,
            s.frequency_penalty,
            s.presence_penalty,
            s.repetition_penalty,
        )
        # the batch's -1 is "unseeded", so every int64 seed is folded into [0, 2**63): only seeds
        # 2**63 apart (-1 and 2**63 - 1) share their draws
        self.int_row = (s.top_k, -1 if s.seed is None else s.seed % 2**63, self.top_logprobs_num)
        self.has_penalty = s.frequency_penalty != 0.0 or s.presence_penalty != 0.0 or s.repetition_penalty != 1.0
        if s.repetition_penalty != 1.0:
            self.prompt_vocab = np.unique(self.prompt_ids)
        if s.logit_bias:
            self.bias_ids = np.fromiter(s.logit_bias.keys(), np.int32, len(s.logit_bias))
            self.bias_values = np.fromiter(s.logit_bias.values(), np.float32, len(s.logit_bias))
        self.early_bias_ids, self.early_bias_values = self.bias_ids, self.bias_values
        if s.min_new_tokens and self.grammar is None:
            # as vLLM and SGLang: before min_new_tokens, EOS and stop_token_ids cannot be sampled (a
            # grammar decides its own end: it may allow nothing else)
            ending = np.array(sorted({*s.stop_token_ids, *(() if s.ignore_eos else self.eos_token_ids)}), np.int32)
            self.early_bias_ids = np.concatenate([self.bias_ids, ending])
            self.early_bias_values = np.concatenate([self.bias_values, np.full(ending.size, -np.inf, np.float32)])

    def step_bias(self) -> tuple[np.ndarray, np.ndarray]:
        """The logit biases (ids, values) of its next sampled token."""
        if len(self.output_ids) < self.sampling.min_new_tokens:
            return self.early_bias_ids, self.early_bias_values
        return self.bias_ids, self.bias_values

    @property
    def fill_len(self) -> int:
        """Tokens whose KV a (re)prefill computes: the prompt and every output so far."""
        return self.prompt_len + len(self.output_ids)

    def fill_ids(self) -> np.ndarray:
        if not self.output_ids:
            return self.prompt_ids
        return np.concatenate([self.prompt_ids, np.asarray(self.output_ids, dtype=np.int32)])

    @property
    def finished(self) -> bool:
        return self.state is ReqState.FINISHED

    def check_finish(self, max_context_len: int) -> dict[str, Any] | None:
        """The finish reason after the last appended token, or None (stop strings are the
        router's: it calls ``Scheduler.finish_request``)."""
        s, n = self.sampling, len(self.output_ids)
        if n >= s.max_new_tokens:
            return {"type": "length", "length": s.max_new_tokens}
        if self.prompt_len + n >= max_context_len:
            return {"type": "length", "length": n}
        if n < s.min_new_tokens:
            return None
        token = self.output_ids[-1]
        if (not s.ignore_eos and token in self.eos_token_ids) or token in s.stop_token_ids:
            return {"type": "stop", "matched": token}
        return None
