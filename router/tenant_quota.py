"""A tenant's limits from --api-key-file: how many of its requests may run at once, and how many
tokens its prefixes may hold in the radix cache (beyond that it evicts its own pages first)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantQuota:
    max_cached_tokens: int | None = None  # None: no limit
    max_running_requests: int | None = None

    def __post_init__(self) -> None:
        for name in QUOTA_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


QUOTA_FIELDS = ("max_cached_tokens", "max_running_requests")  # as the key file names them
