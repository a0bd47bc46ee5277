"""Fixtures of the frontend-language tests: a real server (started the way the e2e tests do)
and the embedded model's own tokenizer, the reference for prompts and token counts."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import radixcluster.lang as sgl


def _e2e_conftest():
    # Imported by path: the tests directory is not a package, and the e2e fixtures stay where they are.
    path = Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"
    spec = importlib.util.spec_from_file_location("radixcluster_e2e_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def server() -> Iterator[object]:
    with _e2e_conftest().launch_server() as handle:
        yield handle


@pytest.fixture(scope="session")
def backend(server) -> Iterator[sgl.RuntimeEndpoint]:
    endpoint = sgl.RuntimeEndpoint(server.url)
    yield endpoint
    endpoint.close()


@pytest.fixture(scope="session")
def tokenizer(model_path: Path):
    from radixcluster.router.tokenizer import load_tokenizer

    return load_tokenizer(model_path)
