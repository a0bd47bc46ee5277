"""PromptMemo: the longest remembered prefix of a text, LRU-bounded."""

from __future__ import annotations

import numpy as np

from radixcluster.router.text.prompt_memo import PromptMemo

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"


def test_the_longest_remembered_prefix_wins():
    memo = PromptMemo()
    memo.remember(SYSTEM + "turn one", np.arange(5))
    memo.remember(SYSTEM + "turn one, answer one", np.arange(9))
    text, ids = memo.longest_prefix(SYSTEM + "turn one, answer one<|im_end|> turn two")
    assert text == SYSTEM + "turn one, answer one" and ids.tolist() == list(range(9))


def test_no_prefix_no_match():
    memo = PromptMemo()
    memo.remember(SYSTEM + "turn one", np.arange(5))
    assert memo.longest_prefix(SYSTEM + "turn two") is None
    assert memo.longest_prefix("something else entirely, longer than the head") is None


def test_the_least_recently_used_text_goes_first():
    memo = PromptMemo(capacity=2)
    memo.remember(SYSTEM + "a", np.arange(1))
    memo.remember(SYSTEM + "b", np.arange(2))
    assert memo.longest_prefix(SYSTEM + "a and more") is not None  # a is now the most recent
    memo.remember(SYSTEM + "c", np.arange(3))
    assert memo.longest_prefix(SYSTEM + "b and more") is None
    assert memo.longest_prefix(SYSTEM + "a and more") is not None
    assert memo.longest_prefix(SYSTEM + "c and more") is not None


def test_remembered_ids_are_a_copy():
    memo = PromptMemo()
    ids = np.arange(4)
    memo.remember(SYSTEM + "x", ids)
    ids[:] = 0
    assert memo.longest_prefix(SYSTEM + "xy")[1].tolist() == [0, 1, 2, 3]


def test_a_text_is_found_only_under_the_salt_it_was_remembered_under():
    """One namespace's answers never change how another's prompts are tokenized."""
    memo = PromptMemo()
    memo.remember(SYSTEM + "turn one", np.arange(5), salt="alice")
    assert memo.longest_prefix(SYSTEM + "turn one, more", "bob") is None
    assert memo.longest_prefix(SYSTEM + "turn one, more") is None
    text, ids = memo.longest_prefix(SYSTEM + "turn one, more", "alice")
    assert text == SYSTEM + "turn one" and ids.tolist() == list(range(5))
