"""Pydantic models of the cache-control calls: a prefix (text or token ids, in a cache salt's
namespace), and a pin's time to live."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from radixcluster.router.api.native_schemas import Key, TokenId

MAX_PIN_TTL_S = 7 * 24 * 3600.0
# /cache/tree's bounds (the router checks them again)
MAX_TREE_DEPTH = 64
TtlSeconds = Annotated[float, Field(gt=0, le=MAX_PIN_TTL_S)]


class CachePrefixIn(BaseModel):
    """``POST /cache/warm``, ``/cache/evict``: a prefix, as /generate's ``text`` (tokenized the
    same way) or ``input_ids``, and the ``cache_salt`` it was sent with, if any."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    text: str | None = Field(default=None, min_length=1)
    input_ids: list[TokenId] | None = Field(default=None, min_length=1)
    cache_salt: Key | None = None
    tenant: Key | None = None  # act for this tenant (router/api/auth.py act_for_tenant)

    @model_validator(mode="after")
    def _one_prefix(self) -> CachePrefixIn:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of text and input_ids must be given")
        return self

    def router_args(self) -> dict[str, Any]:
        prefix: dict[str, Any] = {"text": self.text} if self.text is not None else {"input_ids": self.input_ids}
        return {**prefix, "cache_salt": self.cache_salt}


class PinIn(CachePrefixIn):
    """``POST /cache/pin``: keep the prefix's pages for ``ttl_s`` seconds."""

    ttl_s: TtlSeconds

    def router_args(self) -> dict[str, Any]:
        return {**super().router_args(), "ttl_s": self.ttl_s}


class UnpinIn(CachePrefixIn):
    """``DELETE /cache/pin``: the body of the pin (its ``ttl_s`` may be left in, and is ignored)."""

    ttl_s: TtlSeconds | None = None
