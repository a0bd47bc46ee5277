"""A cache-control call acting for a tenant: who may name one, and which; and the key a request
presents (Anthropic's clients send it as x-api-key)."""

from __future__ import annotations

import contextvars

import pytest

from radixcluster.router.api.auth import act_for_tenant, current_tenant, presented_key
from radixcluster.router.api.errors import ApiError

TENANTS = ("alpha", "beta")


def acting(caller: str | None, named: str | None) -> str | None:
    """The tenant a call by ``caller`` that names ``named`` acts for (in a context of its own)."""

    def call() -> str | None:
        current_tenant.set(caller)
        act_for_tenant(named, TENANTS)
        return current_tenant.get()

    return contextvars.copy_context().run(call)


def test_a_key_without_a_tenant_acts_for_the_one_it_names() -> None:
    assert acting(None, None) is None
    assert acting(None, "beta") == "beta"
    assert acting("alpha", None) == "alpha"
    assert acting("alpha", "alpha") == "alpha"


def test_a_tenant_cannot_act_for_another_and_an_unknown_tenant_is_a_400() -> None:
    with pytest.raises(ApiError) as other:
        acting("alpha", "beta")
    assert other.value.status == 403 and "its own tenant" in str(other.value)
    with pytest.raises(ApiError) as unknown:
        acting(None, "gamma")
    assert unknown.value.status == 400 and "gamma" in str(unknown.value)


@pytest.mark.parametrize(
    "headers,presented",
    [
        ([(b"authorization", b"Bearer k1")], b"Bearer k1"),
        ([(b"x-api-key", b"k2")], b"Bearer k2"),
        ([(b"x-api-key", b"k2"), (b"authorization", b"Bearer k1")], b"Bearer k1"),  # Authorization first
        ([(b"content-type", b"application/json")], b""),
    ],
)
def test_the_key_a_request_presents(headers, presented) -> None:
    assert presented_key(headers) == presented
