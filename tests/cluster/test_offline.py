"""`radixcluster generate`: one prompt through the router's request handling and an in-process
model runner, on the real SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcluster.offline import generate


def test_one_prompt_is_answered_offline(model_path: Path) -> None:
    assert "Paris" in generate("What is the capital of France?", str(model_path), 8, 0.0)


@pytest.mark.parametrize("max_new_tokens, temperature, words", [(-1, 0.0, "max_new_tokens"), (4, -1.0, "temperature")])
def test_a_request_the_router_refuses_is_a_value_error(
    model_path: Path, max_new_tokens: int, temperature: float, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        generate("hi", str(model_path), max_new_tokens, temperature)
