"""Every message that crosses a process boundary: one slotted dataclass each, msgpack on the wire.

A frame is the msgpack array ``[PROTOCOL_VERSION, type name, {field: value}]``. numpy arrays
travel as packed little-endian buffers (an ext type), never as lists of Python ints; a nested
message travels as an ext type of its own. No pickle, ever.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

# 2: block names (TreeEvent.blocks, GET /cache_blocks) from block_hash's tabled terms
# 3: SamplingBatch.prompt_penalty_ids/lens (the repetition penalty counts the prompt too)
# 4: Profile (the router starts and stops torch's profiler on every rank)
PROTOCOL_VERSION = 4
# what the numbers of a request may hold: the router packs them into int32 arrays (token ids,
# counts, top_k), int64 (seed) and float32 (temperature and the other sampling floats)
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38

_EXT_ARRAY = 1
_EXT_MESSAGE = 2
# an integer past msgpack's 64 bits, in decimal: free-form JSON a client sent (a tool call's
# 20-digit order id) travels as it came
_EXT_BIG_INT = 3
_REGISTRY: dict[str, type] = {}


class ProtocolError(ValueError):
    """A frame that is not a message of this protocol version. ``fields``: what it held, when it
    was read that far (its ``rid`` or ``cid`` says whose caller waits for an answer)."""

    def __init__(self, message: str, fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}

    def named(self, field: str) -> str | None:
        """The ``rid`` or ``cid`` the frame held, when it held one: whose caller waits."""
        value = self.fields.get(field)
        return value if isinstance(value, str) else None


def message(cls: type) -> type:
    """Register a dataclass as a wire message under its class name."""
    _REGISTRY[cls.__name__] = cls
    return cls


# ---------------------------------------------------------------- api <-> router


@message
@dataclass(slots=True)
class SamplingParams:
    """SGLang's sampling parameters, already validated by the api."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None  # xgrammar's structural tag JSON (its "format" form)
    # the grammar holds only after the output has written this text (a reasoning model's end of
    # thinking, </think>: SGLang's require_reasoning); None: from the first token
    grammar_after: str | None = None
    # with grammar_after: the thinking opens only if the output starts with this (a model that writes
    # its own <think>); a first token that does not is the answer's. None: it is open from the start
    thinking_start: str | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    stream_interval: int | None = None  # a streaming request's own (SGLang's field); None: the server's
    # max_new_tokens is the api's default, not the client's: the router lowers it to the room
    # the context and the KV pool leave after the prompt (as vLLM does), rather than refusing
    max_new_tokens_is_default: bool = False
    # the client's name of max_new_tokens (OpenAI's max_tokens, ...), which the router's refusals use
    max_new_tokens_name: str = "max_new_tokens"


@message
@dataclass(slots=True)
class PromptPin:
    """Pin a prefix of the request's prompt once its prefill is done (an OpenAI request's
    ``cache_control``): the chat's first ``messages`` messages, or the whole prompt (None)."""

    ttl_s: float
    messages: int | None = None


@message
@dataclass(slots=True)
class PromptTokens:
    """The ids a gateway tokenized a text prompt (a chat rendered first) into, and the fingerprint
    of the tokenizer it used (``Tokenizer.fingerprint``): the router takes them instead of
    tokenizing the text again when its own tokenizer has that fingerprint."""

    tokenizer: str
    ids: np.ndarray


@message
@dataclass(slots=True)
class GenerateRequest:
    """One generation (the api expands batches and ``n`` into several).

    Exactly one of ``text``, ``input_ids`` and ``messages`` (a chat, rendered by the
    router with the model's chat template) is set.
    """

    rid: str
    sampling: SamplingParams
    text: str | None = None
    input_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    # the chat's text ends inside its last message (an assistant's, mostly), which the model continues
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None  # the chat's tools, which its template may write
    # variables of the chat template's own (chat_template_kwargs), such as Qwen's enable_thinking
    chat_template_kwargs: dict[str, Any] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # first prompt position whose logprob is returned; -1: no prompt logprobs
    logprob_start_len: int = -1
    # logprob entries carry each token's text (RequestOutput.token_texts)
    return_text_in_logprobs: bool = False
    # the first output carries the prompt's token ids (vLLM's return_token_ids)
    return_prompt_ids: bool = False
    cache_salt: str | None = None
    # the tenant whose API key sent it (--api-key-file): the router keys its cache by it, whatever
    # the client's cache_salt, and counts its tokens per tenant
    tenant: str | None = None
    pins: list[PromptPin] = field(default_factory=list)
    # vLLM's truncate_prompt_tokens: the prompt keeps its last this many tokens (-1: as many as
    # the context holds); None: the prompt whole
    truncate_prompt_tokens: int | None = None
    # the text's or the chat's ids as the gateway in front tokenized them, if it did
    tokens: PromptTokens | None = None
    # SGLang's: false for the server's own probes (/health_generate), which /cache_info and
    # /metrics do not count
    log_metrics: bool = True


@message
@dataclass(slots=True)
class AbortRequest:
    """The client went away or cancelled: drop the request and release its pages. The
    request's caller, if still waiting, gets a last output with finish reason ``abort``;
    ``abort_all`` ends every request (``rid`` is then ignored)."""

    rid: str
    abort_all: bool = False


@message
@dataclass(slots=True)
class RequestOutput:
    """Router -> api: what a request produced since its last output (deltas), or its error.

    ``status`` is an HTTP status for errors the router found (400: the client's input).
    """

    rid: str
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    pinned_tokens: int = 0  # what the request's pins hold, once its prefill is done
    # per new output token: [logprob, token id, [[top logprob, top id], ...]]
    output_logprobs: list[list[Any]] = field(default_factory=list)
    # prompt tokens from logprob_start_len on: [logprob or None, token id]
    input_logprobs: list[list[Any]] = field(default_factory=list)
    # beside input_logprobs when top_logprobs_num > 0: [[top logprob, top id], ...] or None
    input_top_logprobs: list[Any] = field(default_factory=list)
    # the text of each token id in this output's logprob entries, when asked
    token_texts: dict[int, str] = field(default_factory=dict)
    # the bytes of those tokens that stand for part of a character (their text is U+FFFD)
    partial_bytes: dict[int, list[int]] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)  # in the first output, when asked
    # time.monotonic() on the router's host (the api's) when the request's first token was out,
    # so a request answered once at its end still times its first token (0: none yet)
    first_token_at: float = 0.0
    error: str | None = None
    status: int = 200
    error_param: str | None = None  # the field ``error`` blames, by the client's name


# the control requests the router answers while a step runs: they read what stands still until the
# step ends, so /metrics, /cache_info and /health stay live through a long step (a stuck rank's
# included); the others wait for the step's end
MID_STEP_KINDS = frozenset({"health", "stats", "cache_info", "server_info"})
# a step that has run this long without its result makes /health fail (a rank may be stuck;
# the group is replaced only at --step-timeout)
STEP_OVERDUE_S = 20.0


@message
@dataclass(slots=True)
class ControlRequest:
    """Api -> router: a request that is not a generation (``flush_cache``, ``cache_info``,
    ``server_info``, ``stats``, ``tokenize``, ``detokenize``, ``cache_blocks``; the cache page's
    ``cache_tree`` and the cache-control calls ``cache_pin``, ``cache_unpin``, ``cache_evict``)."""

    cid: str
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


@message
@dataclass(slots=True)
class ControlResponse:
    cid: str
    payload: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


# ---------------------------------------------------------------- router -> gateways


@message
@dataclass(slots=True)
class TreeEvent:
    """One change of a router's radix tree, published (ZeroMQ PUB) to the gateways that route
    by it: ``kind`` "insert" (the blocks are cached now) or "evict" (they are gone).

    ``blocks`` are the names of page-aligned token blocks (uint64, ``radixcluster.block_hash``:
    each covers the cache salt and every token up to the block's end). ``seq`` counts the
    events of one router process from 1 without gaps; ``instance`` names that process, so a
    restarted router (whose tree starts empty) is told from a late message of the old one.
    """

    instance: str
    seq: int
    kind: str
    blocks: np.ndarray


# ---------------------------------------------------------------- router <-> worker


@message
@dataclass(slots=True)
class SamplingBatch:
    """Per-request sampling parameters of one batch, as arrays of length B.

    Penalties count each request's output tokens so far: ``penalty_ids`` holds them
    request after request, ``penalty_lens`` says how many belong to each (0 when the
    request has no penalty). The repetition penalty also covers the prompt's tokens, as in
    transformers, vLLM and SGLang: ``prompt_penalty_ids`` holds each such request's distinct
    prompt tokens, laid out the same way (0 when its repetition penalty is 1). Logit biases
    too: ``bias_ids`` and ``bias_values`` request after request, ``bias_lens`` entries each.
    """

    temperature: np.ndarray  # float32 [B]; 0 means greedy
    top_p: np.ndarray  # float32 [B]
    top_k: np.ndarray  # int32 [B]; -1 means off
    min_p: np.ndarray  # float32 [B]
    frequency_penalty: np.ndarray  # float32 [B]
    presence_penalty: np.ndarray  # float32 [B]
    repetition_penalty: np.ndarray  # float32 [B]
    seed: np.ndarray  # int64 [B]; the request's seed modulo 2**63, or -1: unseeded
    penalty_ids: np.ndarray  # int32 [sum(penalty_lens)]
    penalty_lens: np.ndarray  # int32 [B]
    prompt_penalty_ids: np.ndarray  # int32 [sum(prompt_penalty_lens)]
    prompt_penalty_lens: np.ndarray  # int32 [B]
    top_logprobs_num: np.ndarray  # int32 [B]
    bias_ids: np.ndarray  # int32 [sum(bias_lens)]
    bias_values: np.ndarray  # float32 [sum(bias_lens)]
    bias_lens: np.ndarray  # int32 [B]
    return_logprob: bool = False


@message
@dataclass(slots=True)
class ForwardBatch:
    """One model step. Requests mix extends (a prefill, possibly a chunk, after a cached
    prefix) and decodes (extend_len 1); their new tokens are laid out request after
    request in ``input_ids``/``positions``.

    Page-table deltas are applied before the forward pass, in order:
    ``table[table_slots[d]][table_starts[d] : table_starts[d] + table_counts[d]] =``
    the next ``table_counts[d]`` entries of ``table_pages``. A request's page table then
    covers ``prefix_len + extend_len`` tokens; token ``t`` lives in page
    ``table[slot][t // page_size]`` at offset ``t % page_size``.
    """

    step_id: int
    input_ids: np.ndarray  # int32 [T]
    positions: np.ndarray  # int32 [T]
    slots: np.ndarray  # int32 [B]: each request's row in the mirrored page tables
    prefix_lens: np.ndarray  # int32 [B]: tokens already in the KV cache
    extend_lens: np.ndarray  # int32 [B]: tokens computed this step
    table_slots: np.ndarray  # int32 [D]
    table_starts: np.ndarray  # int32 [D]
    table_counts: np.ndarray  # int32 [D]
    table_pages: np.ndarray  # int32 [sum(table_counts)]
    sampling: SamplingBatch
    # int32 [B, ceil(vocab / 32)]: bit j of word w allows token 32 * w + j; None: no grammar
    vocab_mask: np.ndarray | None = None
    # per request, first of its new tokens whose logprob is wanted; -1: none (input logprobs)
    logprob_starts: np.ndarray | None = None
    # int32 [B], set with logprob_starts: the prompt token after each request's last new token
    # (a chunk of its prompt), scored at that last position too; -1: its prompt ends in this step
    logprob_next_ids: np.ndarray | None = None
    # requests whose contexts share a cached prefix (the radix tree's pages), so attention can
    # read it once per group: int32 [B], each request's group or -1; None when no two share
    prefix_groups: np.ndarray | None = None
    # int32 [G]: the leading tokens every request of group g shares (their first pages equal)
    prefix_group_lens: np.ndarray | None = None


@message
@dataclass(slots=True)
class StepResult:
    """Rank 0 -> router: the sampled token of every request of step ``step_id``."""

    step_id: int
    next_token_ids: np.ndarray  # int32 [B]
    # float32 [B]: log-softmax of the raw logits at the chosen token (when asked)
    logprobs: np.ndarray | None = None
    top_logprob_ids: np.ndarray | None = None  # int32 [B, K]
    top_logprob_values: np.ndarray | None = None  # float32 [B, K]
    # float32 [sum of asked input positions]: logprob of each next prompt token
    input_logprobs: np.ndarray | None = None
    # [sum of asked input positions, K]: the top logprobs there, K the largest top_logprobs_num
    # of the requests that ask for input logprobs; None when K == 0
    input_top_logprob_ids: np.ndarray | None = None  # int32
    input_top_logprob_values: np.ndarray | None = None  # float32


@message
@dataclass(slots=True)
class RankFailed:
    """Any rank -> router (on the results socket): a step raised on this rank. The ranks'
    collectives are out of step from here on, so the rank leaves its loop and the group is
    replaced; ``error`` is the exception's type and message."""

    rank: int
    step_id: int
    error: str


# torch's profiler holds a profile's events in the rank's memory until the stop (~1.4 MB a step
# with stacks and shapes, SGLang's defaults, on SmolLM2): a profile left running would grow the
# rank until it is killed, so one stops itself after this many steps
MAX_PROFILE_STEPS = 1000


@message
@dataclass(slots=True)
class Profile:
    """Router -> every rank, between steps: ``start`` torch's profiler over the model steps
    (``activities``: "CPU", "GPU", "MEM"), or stop it and write each rank's Chrome trace to
    ``output_dir/{prefix}{profile_id}-TP-{rank}.trace.json.gz``."""

    start: bool
    output_dir: str = ""
    profile_id: str = ""
    prefix: str = ""
    activities: list[str] = field(default_factory=list)
    with_stack: bool = False
    record_shapes: bool = False

    def trace_file(self, rank: int) -> str:
        """Where rank ``rank`` writes the trace of the profile this message started."""
        return os.path.join(self.output_dir, f"{self.prefix}{self.profile_id}-TP-{rank}.trace.json.gz")


@message
@dataclass(slots=True)
class Shutdown:
    """Stop the receiving loop (the router's to rank 0, the launcher's to the router)."""


# ---------------------------------------------------------------- launcher <-> router
# (over the router's control pipe: the launcher owns the TP group's processes, the router owns
# the requests, and these say when the one must be replaced for the other to go on)


@message
@dataclass(slots=True)
class RouterReady:
    """Router -> launcher: the sockets are bound, rank 0 may connect."""


@message
@dataclass(slots=True)
class GroupDown:
    """Launcher -> router: group ``generation`` lost a rank (``reason`` names it) and its
    processes are killed; the router re-queues its requests and answers ``RestartGroup``, or
    exits when the restart budget is spent."""

    generation: int
    reason: str


@message
@dataclass(slots=True)
class RestartGroup:
    """Router -> launcher: replace group ``generation`` (hung, failed or dead: ``reason``)."""

    generation: int
    reason: str


@message
@dataclass(slots=True)
class GroupUp:
    """Launcher -> router: group ``generation`` has loaded and serves; steps may run again."""

    generation: int


# ---------------------------------------------------------------- encoding


def _default(obj: Any) -> msgpack.ExtType:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(_EXT_ARRAY, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj).__name__ in _REGISTRY and dataclasses.is_dataclass(obj):
        return msgpack.ExtType(_EXT_MESSAGE, _pack(obj))
    if isinstance(obj, int):
        return msgpack.ExtType(_EXT_BIG_INT, str(obj).encode())
    raise TypeError(f"cannot encode {type(obj).__name__} in a protocol message")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_ARRAY:
        unpacker = msgpack.Unpacker()
        unpacker.feed(data)
        dtype, shape = unpacker.unpack()
        offset = unpacker.tell()
        return np.frombuffer(data, dtype=np.dtype(dtype), offset=offset).reshape(shape)
    if code == _EXT_MESSAGE:
        return decode(data)
    if code == _EXT_BIG_INT:
        return int(data)
    raise ProtocolError(f"unknown ext type {code}")


def _pack(msg: Any) -> bytes:
    fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
    return msgpack.packb([PROTOCOL_VERSION, type(msg).__name__, fields], default=_default, use_bin_type=True)


def encode(msg: Any) -> bytes:
    """Serialize a registered message to one frame."""
    if type(msg).__name__ not in _REGISTRY:
        raise ProtocolError(f"{type(msg).__name__} is not a protocol message")
    return _pack(msg)


def decode(frame: bytes) -> Any:
    """Parse one frame; a wrong version, an unknown type or unknown fields raise ProtocolError."""
    unpacker = msgpack.Unpacker(ext_hook=_ext_hook, raw=False, strict_map_key=False)
    unpacker.feed(frame)
    try:
        if unpacker.read_array_header() != 3:
            raise ProtocolError("a frame is [version, type, fields]")
        version = unpacker.unpack()
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {version!r}, this side speaks {PROTOCOL_VERSION}")
        name = unpacker.unpack()
        cls = _REGISTRY.get(name)
        if cls is None:
            raise ProtocolError(f"unknown message type {name!r}")
        fields = unpacker.unpack()
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"malformed frame: {exc}") from exc
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ProtocolError(f"bad fields for {name}: {exc}", fields if isinstance(fields, dict) else None) from exc
