"""Serving-benchmark workloads: prompts as exact token ids from the model's tokenizer, grouped
into conversations whose later turns append the answers the server really gave, and the ideal
prefix-reuse ratio of what was submitted."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixcluster.router.text.tokenizer import Tokenizer

WORKLOADS = ("shared-prefix", "multi-tenant", "multi-turn", "few-shot", "fork", "random")
_WORD = re.compile(r"Ġ[a-z]{3,}")
# Placeholders the chat template renders verbatim, so its glue can be cut out around them.
_MARKS = ("\x01", "\x02", "\x03", "\x04")


@dataclass(slots=True)
class Conversation:
    """Turns run one after another: turn k's prompt is turn k-1's prompt, its answer, then
    ``segments[k]``. With ``after`` set, the named conversation's last prompt and answer come
    first (a fork's branches continue its trunk), and this one starts once that one ended."""

    segments: list[list[int]]
    after: int | None = None


@dataclass(slots=True)
class Workload:
    name: str
    conversations: list[Conversation]
    output_len: int
    params: dict[str, int] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return sum(len(c.segments) for c in self.conversations)


@dataclass(slots=True)
class _Glue:
    """Chat-template text between messages, as token ids (ChatML for SmolLM2)."""

    system_open: list[int]  # before the system message
    user_open: list[int]  # after the system message, before the first user message
    assistant_open: list[int]  # after a user message: the generation prompt
    next_user: list[int]  # after an assistant answer, before the next user message


class WordSource:
    """Seeded random words, one vocabulary token each, so a length in tokens is exact."""

    def __init__(self, tokenizer: Tokenizer, seed: int) -> None:
        vocab = range(tokenizer.vocab_size)
        self._words = [i for i in vocab if _WORD.fullmatch(tokenizer.id_to_token(i) or "")]
        self._rng = random.Random(seed)

    def take(self, n: int) -> list[int]:
        return self._rng.choices(self._words, k=n)


def _glue(tokenizer: Tokenizer) -> _Glue:
    sys_m, user1, answer, user2 = _MARKS
    messages = [
        {"role": "system", "content": sys_m},
        {"role": "user", "content": user1},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": user2},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    before_sys, rest = text.split(sys_m)
    between_sys_user, rest = rest.split(user1)
    after_user, rest = rest.split(answer)
    between_answer_user, tail = rest.split(user2)
    if tail != after_user:
        raise ValueError("the chat template frames user turns inconsistently")
    pieces = (before_sys, between_sys_user, after_user, between_answer_user)
    return _Glue(*(tokenizer.encode(p, add_special_tokens=False) for p in pieces))


def _fill(words: WordSource, total: int, *frame: list[int], what: str) -> list[int]:
    """``frame[0]`` + random words + ``frame[1:]``, ``total`` tokens in all."""
    n = total - sum(len(f) for f in frame)
    if n < 1:
        raise ValueError(f"{what} must be more than its {total - n} chat-template tokens, got {total}")
    return [*frame[0], *words.take(n), *(t for f in frame[1:] for t in f)]


def _question(words: WordSource, glue: _Glue, question_len: int) -> list[int]:
    return _fill(words, question_len, [], glue.assistant_open, what="--question-len")


def shared_prefix(
    tokenizer: Tokenizer,
    groups: int,
    requests_per_group: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    seed: int,
) -> Workload:
    """``groups`` system prompts of ``prefix_len`` tokens, each asked ``requests_per_group``
    different questions of ``question_len`` tokens (group-major submission order)."""
    words, glue = WordSource(tokenizer, seed), _glue(tokenizer)
    convs = []
    for _ in range(groups):
        prefix = _fill(words, prefix_len, glue.system_open, glue.user_open, what="--prefix-len")
        convs += [Conversation([prefix + _question(words, glue, question_len)]) for _ in range(requests_per_group)]
    params = dict(
        groups=groups, requests_per_group=requests_per_group, prefix_len=prefix_len, question_len=question_len
    )
    return Workload("shared-prefix", convs, output_len, params)


def multi_tenant(
    tokenizer: Tokenizer,
    tenants: int,
    requests_per_tenant: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    seed: int,
) -> Workload:
    """shared-prefix's requests in a seeded random order: many tenants' system prompts
    interleaved, as requests arrive at a cluster in front of several replicas (a cache that
    spreads tenants over replicas by turn splits each one's prefix across them)."""
    shared = shared_prefix(tokenizer, tenants, requests_per_tenant, prefix_len, question_len, output_len, seed)
    convs = list(shared.conversations)
    random.Random(seed).shuffle(convs)
    params = dict(
        tenants=tenants, requests_per_tenant=requests_per_tenant, prefix_len=prefix_len, question_len=question_len
    )
    return Workload("multi-tenant", convs, output_len, params)


def multi_turn(
    tokenizer: Tokenizer, conversations: int, turns: int, prefix_len: int, question_len: int, output_len: int, seed: int
) -> Workload:
    """``conversations`` chats, each with its own ``prefix_len``-token system prompt and
    ``turns`` user messages of ``question_len`` tokens; every turn resends the whole history."""
    words, glue = WordSource(tokenizer, seed), _glue(tokenizer)
    convs = []
    for _ in range(conversations):
        first = _fill(words, prefix_len, glue.system_open, glue.user_open, what="--prefix-len")
        first += _question(words, glue, question_len)
        later = [glue.next_user + _question(words, glue, question_len) for _ in range(turns - 1)]
        convs.append(Conversation([first, *later]))
    params = dict(conversations=conversations, turns=turns, prefix_len=prefix_len, question_len=question_len)
    return Workload("multi-turn", convs, output_len, params)


def few_shot(
    tokenizer: Tokenizer, num_prompts: int, shots: int, shot_len: int, question_len: int, output_len: int, seed: int
) -> Workload:
    """One system header of ``shots`` examples of ``shot_len`` tokens, shared by every prompt."""
    words, glue = WordSource(tokenizer, seed), _glue(tokenizer)
    examples = [t for _ in range(shots) for t in words.take(shot_len)]
    header = glue.system_open + examples + glue.user_open
    convs = [Conversation([header + _question(words, glue, question_len)]) for _ in range(num_prompts)]
    params = dict(num_prompts=num_prompts, shots=shots, shot_len=shot_len, question_len=question_len)
    return Workload("few-shot", convs, output_len, params)


def fork(
    tokenizer: Tokenizer, branches: int, prefix_len: int, question_len: int, output_len: int, seed: int
) -> Workload:
    """One trunk prompt; once it is answered, ``branches`` follow-ups continue trunk + answer."""
    words, glue = WordSource(tokenizer, seed), _glue(tokenizer)
    trunk = _fill(words, prefix_len, glue.system_open, glue.user_open, what="--prefix-len")
    trunk += _question(words, glue, question_len)
    convs = [Conversation([trunk])]
    convs += [Conversation([glue.next_user + _question(words, glue, question_len)], after=0) for _ in range(branches)]
    return Workload(
        "fork", convs, output_len, dict(branches=branches, prefix_len=prefix_len, question_len=question_len)
    )


def random_prompts(tokenizer: Tokenizer, num_prompts: int, input_len: int, output_len: int, seed: int) -> Workload:
    """Prompts of random words and nothing shared (not even a chat template)."""
    words = WordSource(tokenizer, seed)
    convs = [Conversation([words.take(input_len)]) for _ in range(num_prompts)]
    return Workload("random", convs, output_len, dict(num_prompts=num_prompts, input_len=input_len))


def ideal_cached_tokens(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]] | None = None) -> list[int]:
    """Per prompt, in submission order: how many of its leading tokens an earlier request
    already covered: its prompt, then, when ``outputs`` is given, its output but the last
    token (whose KV is never computed). At most ``len(prompt) - 1``: the last prompt token
    is always computed for its logits."""
    root: dict[int, dict] = {}
    shared: list[int] = []
    for i, prompt in enumerate(prompts):
        node, n = root, 0
        for token in prompt:
            if token not in node:
                break
            node, n = node[token], n + 1
        shared.append(min(n, max(len(prompt) - 1, 0)))
        node = root
        for token in [*prompt, *(outputs[i][:-1] if outputs is not None else ())]:
            node = node.setdefault(token, {})
    return shared
