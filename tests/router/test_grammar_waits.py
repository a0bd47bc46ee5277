"""Grammars compiling off the router loop: a request waits for its spec on the compile thread,
gets a matcher, a 400 that says why the spec is wrong, or a 503 when its wait runs out."""

from __future__ import annotations

import json
import time

import pytest

from radixcluster.router.grammar import GrammarCache
from radixcluster.router.grammar_waits import GrammarWaits
from radixcluster.router.text.tokenizer import load_tokenizer

VOCAB = 49152


@pytest.fixture(scope="module")
def grammars(model_path) -> GrammarCache:
    return GrammarCache(load_tokenizer(model_path), VOCAB)


def wait_for(waits: GrammarWaits, count: int) -> list:
    ended: list = []
    deadline = time.monotonic() + 120
    while len(ended) < count and time.monotonic() < deadline:
        ended += waits.finished()
        time.sleep(0.01)
    return ended


def test_requests_for_one_spec_share_one_compile(grammars):
    waits: GrammarWaits[str] = GrammarWaits(grammars)
    key = ("regex", "(yes|no) [0-9]{2}")
    waits.add("a", key, "payload a")
    waits.add("b", key, "payload b")
    assert len(waits) == 2 and "a" in waits
    ended = wait_for(waits, 2)
    assert [e.payload for e in ended] == ["payload a", "payload b"]
    assert all(e.error is None for e in ended)
    assert ended[0].compiled is ended[1].compiled is grammars.lookup(key)
    assert len(waits) == 0


def test_a_spec_that_does_not_compile_is_a_400_that_says_why(grammars):
    waits: GrammarWaits[None] = GrammarWaits(grammars)
    waits.add("bad", ("json_schema", "{not json"), None)
    (ended,) = wait_for(waits, 1)
    assert ended.status == 400 and ended.compiled is None and "invalid json_schema" in ended.error


def test_a_wait_that_runs_out_is_a_503_and_the_spec_is_cached_when_it_finishes(grammars):
    """The clock jumps past the wait: it ends at once, the compile goes on."""
    now = [0.0]
    waits: GrammarWaits[None] = GrammarWaits(grammars, wait_s=5, clock=lambda: now[0])
    spec = json.dumps({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(50)}})
    waits.add("slow", ("json_schema", spec), None)
    now[0] = 6.0
    (ended,) = waits.finished()
    assert (
        ended.status == 503 and ended.error == "the server could not compile the json schema within 5 s (busy): retry"
    )
    deadline = time.monotonic() + 120
    while grammars.lookup(("json_schema", spec)) is None and time.monotonic() < deadline:
        grammars.collect()
        time.sleep(0.01)
    assert grammars.lookup(("json_schema", spec)) is not None


def test_cancelling_drops_the_wait(grammars):
    waits: GrammarWaits[None] = GrammarWaits(grammars)
    waits.add("gone", ("regex", "[a-c]{4}"), None)
    assert waits.cancel("gone") and not waits.cancel("gone")
    assert waits.finished() == [] and waits.rids() == []
