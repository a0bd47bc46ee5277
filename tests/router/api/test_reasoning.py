"""A reasoning model's thinking told apart from its answer, whole and while it grows."""

from __future__ import annotations

import pytest

from radixcluster.router.api.reasoning import REASONING_FORMATS, grammar_gate

R1, QWEN3 = REASONING_FORMATS["deepseek-r1"], REASONING_FORMATS["qwen3"]


@pytest.mark.parametrize(
    "fmt, text, thought, answer",
    [
        # DeepSeek-R1's template opens the thinking: the answer starts inside it
        (R1, "First, 2+2 is 4.\n</think>\n\nThe answer is 4.", "First, 2+2 is 4.\n", "The answer is 4."),
        (R1, "<think>\nHmm.</think>4", "\nHmm.", "4"),
        (R1, "Still thinking when max_tokens ran out", "Still thinking when max_tokens ran out", ""),
        # Qwen 3 writes <think> itself, or answers straight away (enable_thinking false)
        (QWEN3, "<think>\nHmm.\n</think>\n\n4", "\nHmm.\n", "4"),
        (QWEN3, "The answer is 4.", "", "The answer is 4."),
        (QWEN3, "  <think>cut short", "cut short", ""),
    ],
)
def test_thinking_and_answer_are_told_apart(fmt, text: str, thought: str, answer: str) -> None:
    assert fmt.split(text) == (thought, answer)


def test_a_growing_text_holds_what_may_yet_be_a_marker() -> None:
    assert R1.split("Hmm </thi", final=False) == ("Hmm ", "")
    assert R1.split("Hmm </thx", final=False) == ("Hmm </thx", "")
    assert QWEN3.split("<thi", final=False) == ("", "")  # may open a thought
    assert QWEN3.split(" ", final=False) == ("", "")
    assert QWEN3.split("<b>", final=False) == ("", "<b>")


@pytest.mark.parametrize("fmt", [R1, QWEN3])
@pytest.mark.parametrize(
    "text", ["<think>\nLet me see. 2 < 3.\n</think>\n\nYes, 2 < 3.", "Plain </th answer", "<think>never ends </thin"]
)
def test_what_a_stream_sends_is_always_a_prefix_of_the_whole(fmt, text: str) -> None:
    whole = fmt.split(text)
    for end in range(len(text) + 1):
        thought, answer = fmt.split(text[:end], final=False)
        assert whole[0].startswith(thought) and whole[1].startswith(answer), text[:end]


@pytest.mark.parametrize(
    "fmt, text, written",
    [
        (R1, "First, 4.\n</think>\n\nThe answer is 4.", "First, 4.\n</think>"),
        (R1, "Cut short", "Cut short"),
        (QWEN3, " <think>\nHmm.\n</think>\n\n4", " <think>\nHmm.\n</think>"),
        (QWEN3, "The answer is 4.", ""),
    ],
)
def test_the_thinking_as_written_keeps_its_markers(fmt, text: str, written: str) -> None:
    assert fmt.written(text) == written


@pytest.mark.parametrize(
    "parser, kwargs, gate",
    [
        (None, None, (None, None)),  # no reasoning parser: the grammar holds from the first token
        # DeepSeek-R1's template always opens the thinking
        ("deepseek-r1", {"enable_thinking": False}, ("</think>", None)),
        # Qwen 3 thinks unless told not to, and writes <think> itself
        ("qwen3", None, ("</think>", "<think>")),
        ("qwen3", {"enable_thinking": True}, ("</think>", "<think>")),
        ("qwen3", {"enable_thinking": False}, (None, None)),  # its template writes an empty thinking into the prompt
    ],
)
def test_a_chats_grammar_waits_for_the_thinking_it_will_write(parser, kwargs, gate) -> None:
    assert grammar_gate(parser, kwargs) == gate
