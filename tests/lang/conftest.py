"""Fixtures of the frontend-language tests: a client of the shared real server, and the
embedded model's own tokenizer, the reference for prompts and token counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import radixcluster.lang as sgl


@pytest.fixture(scope="session")
def backend(server) -> Iterator[sgl.RuntimeEndpoint]:
    endpoint = sgl.RuntimeEndpoint(server.url)
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="session")
def tokenizer(model_path: Path):
    from radixcluster.router.text.tokenizer import load_tokenizer

    return load_tokenizer(model_path)
