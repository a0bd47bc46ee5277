"""SGLang's stop_regex: the streamed text ends with the first match, which it keeps."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.router.text.stop_regex import RegexStopChecker, StopRegexTimeout

PATTERNS = ["a", "b+", "c.", "[ab]c", r"\d{2}", "x|yz"]


def feed_all(checker: RegexStopChecker, deltas: list[str]) -> list[str]:
    out = []
    for delta in deltas:
        emitted, stopped = checker.feed(delta)
        out.append(emitted)
        if stopped:
            break
    return out


def test_the_match_is_kept_and_nothing_after_it_is_emitted():
    checker = RegexStopChecker([r"[0-9]{4}"])
    assert feed_all(checker, ["The year 19", "69 was", " hot"]) == ["The year 19", "69"]
    assert checker.stopped and checker.matched == "[0-9]{4}"
    assert checker.feed(" more") == ("", True)


def test_the_match_that_ends_first_wins_whatever_the_order():
    checker = RegexStopChecker(["world", "o w"])
    assert feed_all(checker, ["hello world"]) == ["hello w"]
    assert checker.matched == "o w"


def test_a_match_must_end_in_text_fed_once_armed():
    """Before min_new_tokens no match ends the text; one that spans into armed text does."""
    checker = RegexStopChecker([r"\d", "ab"])
    assert checker.feed("1 2 a", armed=False) == ("1 2 a", False)
    assert checker.feed("b!", armed=True) == ("b", True) and checker.matched == "ab"
    later = RegexStopChecker([r"\d+"])
    assert later.feed("12", armed=False) == ("12", False)
    assert later.feed(" x3", armed=True) == (" x3", True)


def test_no_patterns_pass_everything_through():
    checker = RegexStopChecker([])
    assert feed_all(checker, ["any", "thing"]) == ["any", "thing"] and not checker.stopped


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abcxyz0123 ", max_size=30),
    patterns=st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_stops_at_the_first_delta_whose_text_matches(text: str, patterns: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    checker = RegexStopChecker(patterns)
    emitted = "".join(feed_all(checker, deltas))
    assert text.startswith(emitted)
    stop = next((k for k, b in enumerate(bounds[1:]) if any(re.search(p, text[:b]) for p in patterns)), None)
    if stop is None:
        assert emitted == text and not checker.stopped
    else:
        # what was fed up to the first delta that completed a match, cut where the earliest
        # match ends (never taking back what earlier deltas emitted)
        fed = text[: bounds[stop + 1]]
        end = min(m.end() for p in patterns if (m := re.search(p, fed)))
        assert checker.stopped and emitted == fed[: max(end, bounds[stop])]


def test_a_catastrophically_backtracking_pattern_times_out_instead_of_hanging():
    """``(x|xx)+y`` takes exponential time on a run of x without a y; ``re`` would search it for
    ever on the router's loop."""
    checker = RegexStopChecker([r"(x|xx)+y"])
    with pytest.raises(StopRegexTimeout, match="simplify it"):
        for _ in range(400):
            checker.feed("xxxxx")
