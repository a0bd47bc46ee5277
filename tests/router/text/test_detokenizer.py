"""Incremental detokenization and stop strings, on the real SmolLM2 vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixcluster.router.text.detokenizer import IncrementalDetokenizer, StopChecker
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "你是一个资深Python工程师，请回答以下问题：\n\n如何实现一个LRU缓存？",
    "emoji 🎉👍🏽 and flags 🇯🇵 and ❤️ done",
    "def f(x):\n    return  x  +  1\n\n\n",
    "Ünïcödé façade — “quotes” … 日本語 한국어",
    "<|im_start|>assistant\nSure!<|im_end|>\n<|endoftext|>",
]


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> Tokenizer:
    return load_tokenizer(model_path)


def stream(tokenizer: Tokenizer, ids: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    return [detok.add([i]) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("skip", (True, False))
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_deltas_concatenate_to_full_decode(tokenizer: Tokenizer, text: str, skip: bool) -> None:
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids, skip)
    assert "".join(deltas) == tokenizer.decode(ids, skip)
    # Characters spanning several tokens are held, never streamed half-done.
    assert not any("\ufffd" in d for d in deltas)


def test_multi_token_characters_are_held_until_complete(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1
    deltas = stream(tokenizer, ids, True)
    assert deltas[:-2] == [""] * (len(ids) - 1) and deltas[-2:] == ["🎉", ""]


def test_special_tokens_are_kept_or_skipped_without_spaces_around_them(tokenizer: Tokenizer) -> None:
    """As transformers' fast tokenizer decodes them (what SGLang and vLLM answer with)."""
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|><|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|><|endoftext|>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(st.one_of(st.integers(0, 49151), st.integers(0, 16), st.integers(150, 400)), max_size=30),
    chunk=st.integers(1, 4),
    skip=st.booleans(),
)
def test_random_token_sequences(tokenizer: Tokenizer, ids: list[int], chunk: int, skip: bool) -> None:
    """Any ids (special tokens, stray UTF-8 bytes) in chunks of any size decode to the
    same text incrementally as all at once."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    deltas = [detok.add(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    assert "".join(deltas) + detok.flush() == tokenizer.decode(ids, skip)


def stop_stream(
    tokenizer: Tokenizer, text: str, stops: list[str], no_stop_trim: bool = False
) -> tuple[list[str], StopChecker]:
    detok, checker = IncrementalDetokenizer(tokenizer), StopChecker(stops, no_stop_trim)
    emitted = []
    for token_id in tokenizer.encode(text):
        out, stopped = checker.feed(detok.add([token_id]))
        emitted.append(out)
        if stopped:
            return emitted, checker
    out, _ = checker.feed(detok.flush())
    return emitted + [out, checker.flush()], checker


def test_stop_string_across_two_tokens_is_never_streamed(tokenizer: Tokenizer) -> None:
    text = "Hello world, and more text after."
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode(text)][:2] == ["Hello", "Ġworld"]
    emitted, checker = stop_stream(tokenizer, text, ["lo wo"])
    assert "".join(emitted) == "Hel"
    assert checker.stopped and checker.matched == "lo wo"


def test_no_stop_trim_keeps_the_stop_string(tokenizer: Tokenizer) -> None:
    emitted, _ = stop_stream(tokenizer, "Hello world, and more text after.", ["lo wo"], no_stop_trim=True)
    assert "".join(emitted) == "Hello wo"


def test_earliest_stop_string_wins(tokenizer: Tokenizer) -> None:
    text = "第一步：写代码。第二步：测试。END of story"
    emitted, checker = stop_stream(tokenizer, text, ["END", "测试", "never"])
    assert "".join(emitted) == "第一步：写代码。第二步："
    assert checker.matched == "测试"


def test_no_stop_string_emits_everything(tokenizer: Tokenizer) -> None:
    text = "ends with a partial stop: STO"
    emitted, checker = stop_stream(tokenizer, text, ["STOP"])
    assert "".join(emitted) == text and not checker.stopped


def reference_stop(text: str, stops: list[str], no_stop_trim: bool) -> str:
    """The text up to the first stop string to complete (ties: the one starting earliest)."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return text[:end] if no_stop_trim else text[: end - len(stop)]
    return text


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab c", max_size=40),
    stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=10),
    no_stop_trim=st.booleans(),
)
def test_stop_checker_matches_reference(text: str, stops: list[str], cuts: list[int], no_stop_trim: bool) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    checker = StopChecker(stops, no_stop_trim)
    out = []
    for start, end in zip(bounds, bounds[1:]):
        emitted, stopped = checker.feed(text[start:end])
        out.append(emitted)
        if stopped:
            break
    else:
        out.append(checker.flush())
    expected = reference_stop(text, stops, no_stop_trim)
    assert "".join(out) == expected
    # Never a complete stop string in trimmed output, and nothing streamed past it.
    if not no_stop_trim:
        assert not any(s in "".join(out) for s in stops)


def test_stop_strings_completed_before_the_request_is_armed_are_passed_over() -> None:
    """Before min_new_tokens no stop string ends the text; one that began there and completes
    once armed still does."""
    checker = StopChecker(["."])
    assert checker.feed("Paris.", armed=False) == ("Paris.", False)
    assert checker.feed(" Yes. No", armed=True) == (" Yes", True) and checker.matched == "."
    spanning = StopChecker(["aa"])
    assert spanning.feed("xaaa", armed=False) == ("xaa", False)  # "aa" passed over, the last "a" held
    assert spanning.feed("b", armed=True) == ("ab", False)
    assert spanning.feed("aa", armed=True) == ("", True)


def test_a_long_stop_string_is_matched_across_many_deltas() -> None:
    """A 200,000-character stop string (once O(L^2) memory in prefixes) streams through in
    small deltas: its near misses are released, the real match is cut."""
    stop = "ab" * 100_000
    checker = StopChecker([stop, "zz"])
    near_miss = "ab" * 99_999 + "ac"
    emitted = [checker.feed(near_miss[i : i + 7])[0] for i in range(0, len(near_miss), 7)]
    text = "x" + stop + "tail"
    results = [checker.feed(text[i : i + 5]) for i in range(0, len(text), 5)]
    assert "".join(emitted + [out for out, _ in results]) == near_miss + "x"
    assert any(stopped for _, stopped in results) and checker.matched == stop
