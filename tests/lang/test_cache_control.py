"""The client's cache-control helpers against the shared real server: warm a header, pin it,
unpin it, evict what was cached under it, each checked through /cache_info or the next warm's
prefilled tokens."""

from __future__ import annotations

import httpx
import pytest

import radixcluster.lang as sgl

HEADER = "You are a terse assistant for a hardware shop. Answer in one sentence. " * 4


def cache_info(backend: sgl.RuntimeEndpoint) -> dict:
    return httpx.get(backend.base_url + "/cache_info", timeout=30).json()


def test_warm_pin_unpin_and_evict_a_prefix(backend):
    warmed = backend.warm(HEADER)
    assert warmed["prefilled_tokens"] == warmed["prompt_tokens"] > 40
    assert backend.warm(HEADER)["prefilled_tokens"] == 1  # all but the last token was cached
    pinned = backend.pin(HEADER, ttl_s=600)
    assert cache_info(backend)["pinned_tokens"] == pinned["pinned_tokens"] > 40
    assert backend.unpin(HEADER)["unpinned"]
    with pytest.raises(sgl.ServerError) as refused:
        backend.unpin(HEADER)
    assert refused.value.status == 404
    question = HEADER + "Question: which screwdriver fits an M3 screw?"
    backend.warm(question)
    assert backend.warm(question)["prefilled_tokens"] == 1
    assert backend.evict(HEADER)["evicted_tokens"] > 0  # the runs under the header
    assert backend.warm(question)["prefilled_tokens"] > 1  # computed again


def test_a_bad_prefix_is_the_servers_clear_400(backend):
    with pytest.raises(sgl.ServerError, match="exactly one of text and input_ids") as refused:
        backend.warm()
    assert refused.value.status == 400
    with pytest.raises(sgl.ServerError) as refused:
        backend.pin(HEADER, ttl_s=-1)
    assert refused.value.status == 400 and "ttl_s" in refused.value.message
