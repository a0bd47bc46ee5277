"""SegmentEncoder: the ids of any text, special tokens and long remembered stretches included,
are exactly the tokenizer's; a tokenizer whose stretches do not tokenize alone as in place is
not cut."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from radixcluster.gateway.segment_encoder import MIN_CACHED_CHARS, SegmentEncoder
from radixcluster.router.text.piece_encoder import PieceEncoder
from radixcluster.router.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(model_path):
    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def encoder(tokenizer) -> SegmentEncoder:
    return SegmentEncoder(tokenizer, capacity=4)


SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
SYSTEM = "You are a careful assistant. " * 20  # longer than MIN_CACHED_CHARS
pieces = st.one_of(
    st.sampled_from([*SPECIALS, " ", "\n", "  ", "system\n", "user\n", SYSTEM, "ünïcode ✓ 42", "<|im_", "start|>"]),
    st.text(max_size=40),
)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(pieces, max_size=12), bos=st.booleans())
def test_ids_are_the_tokenizers(tokenizer, encoder: SegmentEncoder, parts: list[str], bos: bool) -> None:
    text = "".join(parts)
    assert encoder.encode(text, bos) == tokenizer.encode(text, bos)


def test_a_shared_system_prompt_is_remembered_and_chats_stay_exact(tokenizer) -> None:
    encoder = SegmentEncoder(tokenizer, capacity=2)
    assert len(SYSTEM) >= MIN_CACHED_CHARS
    for question in ("What is 2 + 2?", "Name a prime.", "Why is the sky blue?"):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert encoder.encode(rendered, False) == tokenizer.encode(rendered, False)
    assert list(encoder._stretches) == [f"system\n{SYSTEM}"], "only the long stretch, once"
    for i in range(3):  # least recently used out
        encoder.encode(f"<|im_start|>{i}{SYSTEM}", False)
    assert f"system\n{SYSTEM}" not in encoder._stretches and len(encoder._stretches) == 2


def test_added_tokens_that_take_in_spaces_turn_the_cutting_off(tokenizer) -> None:
    backend = Backend.from_str(tokenizer.backend.to_str())
    backend.add_tokens([AddedToken("<tool>", lstrip=True, rstrip=True)])
    changed = dataclasses.replace(tokenizer, backend=backend, pieces=PieceEncoder.for_backend(backend))
    encoder = SegmentEncoder(changed)
    text = f"call  <tool>  now {SYSTEM}"
    assert encoder._cutter is None and changed.pieces is None
    assert encoder.encode(text) == changed.encode(text)
