"""The GGUF header reader against the gguf package's own reader on the embedded model: every
metadata value and every tensor's bytes, shape and type equal; bad files named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from radixcluster.gguf_file import read_gguf
from radixcluster.model_config import open_gguf
from radixcluster.model_path import ModelPathError


def test_metadata_and_tensors_equal_the_gguf_packages(model_path: Path) -> None:
    ours, theirs = read_gguf(model_path), GGUFReader(model_path)
    # the package adds its own header fields (GGUF.version, ...), which are not metadata
    expected = {key: field.contents() for key, field in theirs.fields.items() if not key.startswith("GGUF.")}
    assert ours.metadata.keys() == expected.keys()
    for key, value in expected.items():
        assert ours.metadata[key] == value and type(ours.metadata[key]) is type(value), key
    assert len(ours.metadata["tokenizer.ggml.tokens"]) == 49152
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, reference in zip(ours.tensors, theirs.tensors):
        data = ours.tensor_data(mine)
        assert mine.ggml_type == int(reference.tensor_type)
        assert data.dtype == reference.data.dtype and data.shape == reference.data.shape, mine.name
        assert np.array_equal(data, reference.data), mine.name


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"not a model at all", "GGUF magic"),
        (b"GGUF\x01\x00\x00\x00" + bytes(16), "version 1"),
        (b"GGUF\x03\x00", "error"),
    ],
)
def test_a_bad_file_is_named_with_what_is_wrong(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / f"bad-{len(content)}.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelPathError, match=words) as caught:
        open_gguf(path)
    assert str(path) in str(caught.value)


def test_a_file_cut_short_is_named(model_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(model_path.read_bytes()[:100_000])  # inside the vocabulary
    with pytest.raises(ModelPathError, match="not a readable GGUF file"):
        open_gguf(path)
