"""Block names: numpy's tables and arithmetic give the scheme written out with Python integers
(for token ids and positions inside the tables and past them), and a run named in pieces from
the states between them is named as a whole."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.block_hash import extend, initial_state, prefix_block_hashes

MASK = (1 << 64) - 1


def mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def reference_names(tokens: list[int], start: int, page_size: int, state: int) -> list[int]:
    """The state after each token is the state before it plus the token's mixed value times
    its position's (odd); a block's name is the state at its end."""
    names = []
    for i, token in enumerate(tokens):
        position = start + i
        state = (state + mix(token) * (mix(position ^ 0xD6E8FEB86659FD93) | 1)) & MASK
        if (i + 1) % page_size == 0:
            names.append(state)
    return names


token_ids = st.one_of(st.integers(0, 50_000), st.integers(0, 2**40))  # huge ids go past the table


@settings(max_examples=100, deadline=None)
@given(
    st.lists(token_ids, max_size=40),
    st.sampled_from([0, 16, 2**21]),  # the last is past the positions' table
    st.sampled_from([1, 4, 16]),
    st.integers(0, MASK),
)
def test_names_are_the_schemes(tokens, start, page_size, state) -> None:
    names, end_state = extend(state, np.asarray(tokens, dtype=np.int64), start, page_size)
    assert names.tolist() == reference_names(tokens, start, page_size, state)
    if tokens:
        assert end_state == reference_names(tokens, start, 1, state)[-1]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 50_000), min_size=1, max_size=64), st.integers(0, 4), st.sampled_from([1, 4]))
def test_a_run_named_in_pieces_is_named_as_a_whole(tokens, cut_pages, page_size) -> None:
    ids = np.asarray(tokens, dtype=np.int64)
    cut = min(cut_pages * page_size, len(tokens) // page_size * page_size)
    first, state = extend(initial_state("salt"), ids[:cut], 0, page_size)
    second, _ = extend(state, ids[cut:], cut, page_size)
    whole = prefix_block_hashes(ids, page_size, "salt")
    assert first.tolist() + second.tolist() == whole.tolist()
