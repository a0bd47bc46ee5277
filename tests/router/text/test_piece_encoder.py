"""PieceEncoder: the ids of any text are exactly the tokenizers library's, for SmolLM2's
pre-tokenizer (single digits, then byte-level) and GPT-2's (byte-level alone); a tokenizer
whose cutting it does not spell gets none."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as Backend

from radixcluster.router.text import piece_encoder
from radixcluster.router.text.piece_encoder import MAX_PIECE_CHARS, PieceEncoder
from radixcluster.router.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def smollm2(model_path) -> Backend:
    return load_tokenizer(model_path).backend


def changed(backend: Backend, **fields) -> Backend:
    """The backend with some of tokenizer.json's top-level fields replaced."""
    spec = json.loads(backend.to_str())
    spec.update(fields)
    return Backend.from_str(json.dumps(spec))


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}

# every class the pattern tells apart: letters, digits, the contractions, each ASCII space
# (and 0x1c-0x1f, which str.isspace calls space and the library does not), punctuation,
# control bytes, added tokens whole and in part, and text that is not ASCII
pieces = st.one_of(
    st.sampled_from(
        [*"aZq09 \t\n\r\x0b\x0c\x1c\x1f\x00\x7f'.,!-_(<|>", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "  "]
        + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_", "word", " 42", "é", "日本", " 🎉"]
    ),
    st.text(alphabet=st.characters(max_codepoint=127), max_size=12),
    st.text(max_size=6),
)


@pytest.fixture(scope="module", params=["smollm2", "gpt2"])
def backend_and_encoder(request, smollm2: Backend) -> tuple[Backend, PieceEncoder]:
    backend = smollm2 if request.param == "smollm2" else changed(smollm2, pre_tokenizer=BYTE_LEVEL)
    encoder = PieceEncoder.for_backend(backend)
    assert encoder is not None
    return backend, encoder


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(pieces, max_size=24))
def test_ids_are_the_librarys(backend_and_encoder: tuple[Backend, PieceEncoder], parts: list[str]) -> None:
    backend, encoder = backend_and_encoder
    text = "".join(parts)
    assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids, "remembered as computed"


def test_the_embedded_tokenizer_takes_it_and_natural_text_is_exact(model_path, hf_tokenizer) -> None:
    tokenizer = load_tokenizer(model_path)
    assert tokenizer.pieces is not None
    text = (
        "Don't panic: it's 12:45 on 2026-12-03, and we'll ship v1.2.3 (maybe).\n\n"
        "    def f(x):\n\treturn x**2  # they've   said so\r\n"
    ) * 3
    assert tokenizer.encode(text) == hf_tokenizer.encode(text)


@pytest.mark.parametrize(
    "fields",
    [
        {"normalizer": {"type": "NFC"}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}},
        {"pre_tokenizer": {**BYTE_LEVEL, "add_prefix_space": True}},
        {"pre_tokenizer": {**BYTE_LEVEL, "use_regex": False}},
        {
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": False}, BYTE_LEVEL],
            }
        },
        {
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [{"type": "Punctuation", "behavior": "Isolated"}, BYTE_LEVEL],
            }
        },
    ],
    ids=["normalizer", "metaspace", "prefix-space", "no-regex", "contiguous-digits", "punctuation"],
)
def test_a_cutting_it_does_not_spell_gets_no_encoder(smollm2: Backend, fields: dict) -> None:
    assert PieceEncoder.for_backend(changed(smollm2, **fields)) is None


def test_bpe_dropout_gets_no_encoder(smollm2: Backend) -> None:
    model = json.loads(smollm2.to_str())["model"]
    assert PieceEncoder.for_backend(changed(smollm2, model={**model, "dropout": 0.1})) is None


def test_what_it_remembers_is_bounded(smollm2: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = PieceEncoder.for_backend(smollm2)
    assert encoder is not None
    long_word = "a" * (MAX_PIECE_CHARS + 1)
    assert encoder.encode(long_word) == smollm2.encode(long_word, add_special_tokens=False).ids
    assert long_word not in encoder._known
    monkeypatch.setattr(piece_encoder, "MAX_PIECES", 3)
    text = "one two three four five"
    assert encoder.encode(text) == smollm2.encode(text, add_special_tokens=False).ids
    assert len(encoder._known) <= 3
