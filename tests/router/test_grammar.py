"""Grammars with the real SmolLM2 tokenizer: compile cache, error messages, exact masks, and the
scheduler driving matchers (masks in the batch, grammar stops) against the stand-in executor."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from radixcluster.protocol import ForwardBatch, SamplingParams, StepResult
from radixcluster.router.batch_builder import build_vocab_mask
from radixcluster.router.grammar import GrammarCache, RequestGrammar
from radixcluster.router.grammar_compile import GrammarError
from radixcluster.router.request import Request
from radixcluster.router.scheduler import Scheduler, SchedulerConfig
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer
from support.stand_in_executor import StandInExecutor, reference_generate

VOCAB = 49152  # SmolLM2's logits
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def grammars(tokenizer) -> GrammarCache:
    return GrammarCache(tokenizer, VOCAB)


def allowed(mask_row: np.ndarray) -> set[int]:
    """Token ids whose bit is set (bit j of int32 word w allows token 32 * w + j)."""
    bits = np.unpackbits(np.ascontiguousarray(mask_row, dtype="<i4").view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits[:VOCAB]).tolist())


def next_allowed(grammar: RequestGrammar) -> set[int]:
    mask = np.zeros((1, grammar.mask_width), dtype=np.int32)
    grammar.fill(mask, 0)
    return allowed(mask[0])


# ---------------------------------------------------------------- compiling

TAG_CITY = {
    "type": "tag",
    "begin": "<f=w>",
    "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
    "end": "</f>",
}
TAG_UNIQUE = {**TAG_CITY, "content": {"type": "json_schema", "json_schema": {"type": "array", "uniqueItems": True}}}


def test_a_spec_is_compiled_once(grammars):
    spec = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}})
    hits, misses = grammars.hits, grammars.misses
    first = grammars.compile("json_schema", spec)
    assert grammars.compile("json_schema", spec) is first
    assert (grammars.hits, grammars.misses) == (hits + 1, misses + 1)
    # the kind is part of the key: the same text as an EBNF string literal is another grammar
    assert grammars.compile("ebnf", f"root ::= {json.dumps(spec)}") is not grammars.compile("regex", "n")


def test_the_cache_keeps_the_grammars_of_recent_specs_within_its_memory(tokenizer):
    """A JSON schema's token masks take ~8 MB: a client's distinct schemas drop the least
    recently used ones past the byte bound (and the newest is kept whatever its size)."""
    schemas = [json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"}}}) for i in range(4)]
    one = GrammarCache(tokenizer, VOCAB).compile("json_schema", schemas[0]).memory_size_bytes
    assert one > 2**20
    cache = GrammarCache(tokenizer, VOCAB, max_bytes=int(2.5 * one))
    compiled = [cache.compile("json_schema", schema) for schema in schemas[:2]]
    assert cache.lookup(("json_schema", schemas[0])) is compiled[0]  # now the most recently used
    cache.compile("json_schema", schemas[2])
    assert cache.lookup(("json_schema", schemas[1])) is None and cache.lookup(("json_schema", schemas[0])) is not None
    assert cache.cached_bytes <= cache.max_bytes
    tiny = GrammarCache(tokenizer, VOCAB, max_bytes=1)
    tiny.compile("json_schema", schemas[3])
    assert tiny.lookup(("json_schema", schemas[3])) is not None


@pytest.mark.parametrize(
    ("kind", "spec", "says"),
    [
        ("regex", "(ab", "parenthesis is not closed"),
        ("regex", "[a-", "Unclosed '['"),
        ("json_schema", '{"type": "object"', "Failed to parse JSON"),
        ("json_schema", '{"type": 5}', "Type should be a string"),
        ("json_schema", "[1, 2]", "should be an object or bool"),
        ("ebnf", 'root ::= "a', "string literal"),
        ("ebnf", 'start ::= "a"', 'root rule with name "root" is not found'),
        # compiles, but no token can start it: every request would end at once with an abort
        ("regex", r"[^\x00-\U0010FFFF]", "it matches no text"),
        ("ebnf", r"root ::= [^\x00-\U0010FFFF]", "it matches no text"),
        ("structural_tag", '{"type": "structural_tag"}', "must have a format field"),
        (
            "structural_tag",
            '{"type": "structural_tag", "format": {"type": "tagz"}}',
            "Format type not recognized: tagz",
        ),
        ("structural_tag", json.dumps({"type": "structural_tag", "format": TAG_UNIQUE}), "'uniqueItems' (at /)"),
    ],
)
def test_a_bad_spec_says_what_is_wrong(grammars, kind, spec, says):
    with pytest.raises(GrammarError) as info:
        grammars.compile(kind, spec)
    message = str(info.value)
    assert message.startswith(f"invalid {kind}: ") and says in message
    assert ".cc:" not in message  # xgrammar's source location is noise to a client


def test_a_structural_tag_constrains_only_what_follows_its_trigger(grammars, tokenizer):
    # SGLang's older form, as the api rewrites it: free text, then after "<f=" one of the tags
    spec = {"type": "triggered_tags", "triggers": ["<f="], "tags": [TAG_CITY]}
    grammar = grammars.for_request(
        SamplingParams(structural_tag=json.dumps({"type": "structural_tag", "format": spec}))
    )
    eos = set(tokenizer.eos_token_ids)
    for token in tokenizer.encode("Sure: ", add_special_tokens=False):
        assert eos <= next_allowed(grammar)  # free text may end anywhere
        assert grammar.accept(token) is None
    for token in tokenizer.encode('<f=w>{"city": "Paris"', add_special_tokens=False):
        assert grammar.accept(token) is None
    assert not eos & next_allowed(grammar)  # inside the tag: it must be finished first
    for token in tokenizer.encode("}</f> ok", add_special_tokens=False):
        assert grammar.accept(token) is None
    assert eos <= next_allowed(grammar)
    inside = grammars.for_request(SamplingParams(structural_tag=json.dumps({"type": "structural_tag", "format": spec})))
    for token in tokenizer.encode('<f=w>{"town', add_special_tokens=False)[:-1]:
        assert inside.accept(token) is None
    assert inside.accept(tokenizer.encode('<f=w>{"town', add_special_tokens=False)[-1])["type"] == "abort"


def test_no_grammar_no_matcher(grammars):
    assert grammars.for_request(SamplingParams()) is None


# ---------------------------------------------------------------- masks and matchers


def test_the_mask_allows_exactly_the_grammars_next_tokens(grammars, tokenizer):
    grammar = grammars.for_request(SamplingParams(regex="(yes|no)"))
    texts = {i: tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.vocab_size)}
    expected = {
        i for i, t in texts.items() if t and ("yes".startswith(t) or "no".startswith(t)) and not tokenizer.is_special(i)
    }
    assert expected and next_allowed(grammar) == expected
    for token in tokenizer.encode("ye", add_special_tokens=False):
        assert grammar.accept(token) is None
    assert next_allowed(grammar) == {i for i, t in texts.items() if t == "s" and not tokenizer.is_special(i)}


def test_eos_only_when_the_grammar_may_end_then_it_stops(grammars, tokenizer):
    grammar = grammars.for_request(SamplingParams(regex=PHONE))
    eos = set(tokenizer.eos_token_ids)
    for token in tokenizer.encode("(555) 123-456", add_special_tokens=False):
        assert not eos & next_allowed(grammar)
        assert grammar.accept(token) is None
    assert grammar.accept(tokenizer.encode("7", add_special_tokens=False)[0]) is None
    assert next_allowed(grammar) == eos  # complete: nothing but a stop token
    assert grammar.accept(2) == {"type": "stop", "matched": 2}


@pytest.mark.parametrize("any_whitespace", [True, False])
def test_a_json_schema_allows_any_whitespace_unless_compact_is_asked(tokenizer, any_whitespace):
    cache = GrammarCache(tokenizer, VOCAB, json_any_whitespace=any_whitespace)
    grammar = cache.for_request(SamplingParams(json_schema=json.dumps({"type": "object"})))
    assert grammar.accept(tokenizer.encode("{", add_special_tokens=False)[0]) is None
    newline = {i for i in next_allowed(grammar) if tokenizer.decode([i]).startswith("\n")}
    # SGLang's and vLLM's default lets a model indent ("{\n  ..."); compact allows none
    assert bool(newline) == any_whitespace


def test_a_token_outside_the_grammar_aborts(grammars, tokenizer):
    grammar = grammars.for_request(SamplingParams(regex=r"\d+"))
    reason = grammar.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert reason["type"] == "abort" and "violates" in reason["message"]


@pytest.mark.parametrize("spelled", ["canonical", "one character a token"])
def test_a_grammar_held_back_while_the_model_thinks_holds_from_the_token_after_the_marker(grammars, tokenizer, spelled):
    """SGLang's require_reasoning: until the output writes </think>, however its tokens spell it,
    the matcher stays at its start; from the next token it holds."""
    grammar = grammars.for_request(SamplingParams(regex=PHONE, grammar_after="</think>"))
    plain = grammars.for_request(SamplingParams(regex=PHONE))
    thinking = tokenizer.encode("<think>A phone number, then.", add_special_tokens=False)
    if spelled == "canonical":
        marker = tokenizer.encode("</think>", add_special_tokens=False)
    else:
        marker = [tokenizer.encode(c, add_special_tokens=False)[0] for c in "</think>"]
    assert len(marker) > 1
    for token in [*thinking, *marker[:-1]]:
        assert grammar.gate is not None and grammar.accept(token) is None  # a phone number starts with none
    assert grammar.accept(marker[-1]) is None and grammar.gate is None
    assert next_allowed(grammar) == next_allowed(plain)
    assert grammar.accept(tokenizer.encode("x", add_special_tokens=False)[0])["type"] == "abort"


def test_no_token_may_complete_the_marker_and_write_on_past_it(grammars, tokenizer):
    """What a token wrote after </think> would be the answer's, unchecked by the grammar: once the
    output ends with "</think", ">" may follow but not ">." (one of SmolLM2's tokens)."""
    grammar = grammars.for_request(SamplingParams(regex="[0-9]+", grammar_after="</think>"))
    assert not grammar.masks  # nothing of the marker written yet: no row needed
    for token in tokenizer.encode("Hmm </think", add_special_tokens=False):
        assert grammar.accept(token) is None
    assert grammar.masks
    texts = {i: tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.vocab_size)}
    allowed_now = next_allowed(grammar)
    spilling = {i for i, t in texts.items() if t.startswith(">") and len(t) > 1}
    assert {i for i, t in texts.items() if t == ">"} <= allowed_now and tokenizer.encode(">.")[0] in spilling
    assert not allowed_now & spilling and len(allowed_now) == VOCAB - len(spilling)


def test_a_first_token_that_does_not_open_the_thinking_is_the_answers(grammars, tokenizer):
    """A model that writes its own start marker (Qwen 3's <think>, here "Okay", one SmolLM2 token)
    thinks only if its answer opens with it; else the grammar holds from the first token."""
    (okay,) = tokenizer.encode("Okay", add_special_tokens=False)
    sp = SamplingParams(regex="[0-9]+", grammar_after="</think>", thinking_start="Okay")
    plain = next_allowed(grammars.for_request(SamplingParams(regex="[0-9]+")))
    first = grammars.for_request(sp)
    opens = {i for i in range(tokenizer.vocab_size) if tokenizer.decode([i]).lstrip().startswith("Okay")}
    assert okay in opens and next_allowed(first) == plain | opens
    four = tokenizer.encode("4", add_special_tokens=False)[0]
    assert first.accept(four) is None and first.gate is None  # the answer's: under the grammar from here
    assert tokenizer.encode("x", add_special_tokens=False)[0] not in next_allowed(first)
    thinks = grammars.for_request(sp)
    for token in tokenizer.encode("Okay, letters.</think>", add_special_tokens=False):
        assert thinks.accept(token) is None
    assert thinks.gate is None and next_allowed(thinks) == plain


def test_a_thinking_grammar_request_is_unmasked_until_its_marker(grammars, tokenizer):
    sp = SamplingParams(regex="a+", grammar_after="</think>")
    g = Request("g", prompt(1, 10), sp, tokenizer.eos_token_ids, grammar=grammars.for_request(sp))
    assert build_vocab_mask([g], [0], [10]) is None  # no row needs a mask: the fast path
    for token in tokenizer.encode("</think>", add_special_tokens=False):
        g.grammar.accept(token)
        g.output_ids.append(token)
    mask = build_vocab_mask([g], [0], [g.fill_len])
    assert mask is not None and allowed(mask[0]) == next_allowed(grammars.for_request(SamplingParams(regex="a+")))


def test_special_tokens_are_never_allowed_as_text(grammars, tokenizer):
    grammar = grammars.for_request(SamplingParams(regex=r"[<|a-z_>]{1,20}"))
    assert not next_allowed(grammar) & tokenizer.special_ids


# ---------------------------------------------------------------- through the scheduler


class MaskedExecutor(StandInExecutor):
    """The stand-in, plus what rank 0's sampler does with a mask: a masked row gets an allowed
    token, picked by the stand-in's hash of the request's context (so, as with a model, the
    output depends on the context only, not on the batch or the pool)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.masks: list[np.ndarray | None] = []

    def __call__(self, fwd: ForwardBatch) -> StepResult:
        result = super().__call__(fwd)
        self.masks.append(fwd.vocab_mask)
        if fwd.vocab_mask is not None:
            for i, row in enumerate(fwd.vocab_mask):
                if (row != -1).any():
                    choices = sorted(allowed(row))
                    result.next_token_ids[i] = choices[result.next_token_ids[i] % len(choices)]
        return result


def run(s: Scheduler, ex: MaskedExecutor) -> None:
    for _ in range(10_000):
        batch = s.schedule()
        if batch is None:
            assert s.is_idle()
            return
        s.process_result(batch, ex(batch.forward))
        s.check_integrity()
    raise AssertionError("stuck")


def make(num_pages: int, chunk: int = 512, max_running: int = 8) -> tuple[Scheduler, MaskedExecutor]:
    cfg = SchedulerConfig(num_pages, 1, max_running, chunk, 4096)
    return Scheduler(cfg), MaskedExecutor(num_pages, 1, max_running, 4097)


def prompt(seed: int, n: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 1000, n).astype(np.int32)


def test_grammar_requests_follow_their_grammar_and_others_are_untouched(grammars, tokenizer):
    s, ex = make(num_pages=4096, chunk=64)
    constrained = [
        Request(
            f"g{i}",
            prompt(i, 100),
            SamplingParams(max_new_tokens=64, regex=PHONE),
            tokenizer.eos_token_ids,
            grammar=grammars.for_request(SamplingParams(regex=PHONE)),
        )
        for i in range(3)
    ]
    free = Request("free", prompt(9), SamplingParams(max_new_tokens=16, ignore_eos=True), (7,))
    for r in [*constrained, free]:
        s.add_request(r)
    run(s, ex)
    for r in constrained:
        assert (
            r.finish_reason == {"type": "stop", "matched": r.output_ids[-1]}
            and r.output_ids[-1] in tokenizer.eos_token_ids
        )
        assert re.fullmatch(PHONE, tokenizer.decode(r.output_ids)), tokenizer.decode(r.output_ids)
    assert free.output_ids == reference_generate(free.prompt_ids, 16)
    # chunked prefill (100-token prompts, 64-token chunks): a first chunk samples nothing, so no mask
    assert ex.masks[0] is None and any(m is not None for m in ex.masks)


def test_no_grammar_in_the_batch_means_no_mask():
    s, ex = make(num_pages=512)
    s.add_request(Request("plain", prompt(1), SamplingParams(max_new_tokens=8, ignore_eos=True), (7,)))
    run(s, ex)
    assert ex.masks and all(m is None for m in ex.masks)


def test_retracted_grammar_requests_resume_where_they_were(tokenizer):
    # compact separators: the stand-in executor's tokens would pad free whitespace past the limit
    grammars = GrammarCache(tokenizer, VOCAB, json_any_whitespace=False)
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["red", "green"]}},
            "required": ["id", "tag"],
        }
    )
    sp = SamplingParams(max_new_tokens=24, json_schema=schema)
    shared = prompt(20, 30)
    outputs = {}
    for pages in (64, 4096):
        s, ex = make(num_pages=pages, max_running=4, chunk=64)
        reqs = [
            Request(f"j{i}", np.append(shared, 3 + i), sp, tokenizer.eos_token_ids, grammar=grammars.for_request(sp))
            for i in range(4)
        ]
        for r in reqs:
            s.add_request(r)
        run(s, ex)
        outputs[pages] = [r.output_ids for r in reqs]
        assert (s.counters.retractions_total > 0) == (pages == 64)
        for r in reqs:
            assert r.finish_reason["type"] == "stop", r.finish_reason
            value = json.loads(tokenizer.decode(r.output_ids))
            assert set(value) == {"id", "tag"} and 0 <= value["id"] <= 99 and value["tag"] in ("red", "green")
    assert outputs[64] == outputs[4096]


def test_build_vocab_mask_rows(grammars, tokenizer):
    sp = SamplingParams(regex="a+")
    g = Request("g", prompt(1, 10), sp, tokenizer.eos_token_ids, grammar=grammars.for_request(sp))
    plain = Request("p", prompt(2, 10), SamplingParams(), (7,))
    assert build_vocab_mask([g, plain], [0, 0], [4, 10]) is None  # g is mid-prefill: samples nothing
    mask = build_vocab_mask([plain, g], [0, 0], [10, 10])
    assert mask.shape == (2, VOCAB // 32) and mask.dtype == np.int32
    assert (mask[0] == -1).all() and allowed(mask[1]) == next_allowed(g.grammar)
