"""The router's own checks on a GenerateRequest, for messages that did not come through the api's
schemas (any client of the router's socket): with the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from radixcluster.protocol import GenerateRequest, SamplingParams
from radixcluster.router.request_intake import RequestIntake, RequestRejected
from radixcluster.router.text.tokenizer import load_tokenizer

VOCAB = 49152  # SmolLM2's logits


@pytest.fixture(scope="module")
def intake(model_path) -> RequestIntake:
    return RequestIntake(load_tokenizer(model_path), VOCAB, context_length=8192, pool_tokens=100_000)


def generate(**sampling) -> GenerateRequest:
    return GenerateRequest(rid="r", sampling=SamplingParams(max_new_tokens=4, **sampling), input_ids=[504, 3458])


def test_a_logit_bias_becomes_the_requests_bias_rows(intake: RequestIntake) -> None:
    request, _ = intake.make_request(generate(logit_bias={28: 5.0, 0: -100.0}))
    assert request.bias_ids.tolist() == [28, 0] and request.bias_values.tolist() == [5.0, -100.0]
    plain, _ = intake.make_request(generate())
    assert plain.bias_ids.size == 0


@pytest.mark.parametrize(
    "bias, why",
    [
        ({VOCAB: 1.0}, "outside the vocabulary"),
        ({-1: 1.0}, "outside the vocabulary"),
        ({2**70: 1.0}, "no token id"),
        ({28: float("nan")}, "finite numbers"),
        ({28: float("inf")}, "finite numbers"),
        ({28: "high"}, "finite numbers"),
    ],
)
def test_a_logit_bias_the_api_would_refuse_is_refused_here_too(intake: RequestIntake, bias: dict, why: str) -> None:
    with pytest.raises(RequestRejected, match=why):
        intake.make_request(generate(logit_bias=bias))
