"""A RouterConfig for in-process router tests: one CPU rank in fp32 with pages of one token and
the radix cache on; each test names its pool, context and limits."""

from __future__ import annotations

from radixcluster.model_path import served_model_name
from radixcluster.router.router_process import RouterConfig


def in_process_router_config(model_path: str, **fields: object) -> RouterConfig:
    """``fields``: the pool, context and limits (``num_pages``, ``context_length``,
    ``max_running_requests``, ``chunked_prefill_size``, ``max_queued_requests``), and any field
    that differs from the common ones."""
    common = dict(
        model_path=model_path,
        served_model_name=served_model_name(model_path),
        page_size=1,
        schedule_policy="lpm",
        eviction_policy="lru",
        enable_radix_cache=True,
        tp_size=1,
        device="cpu",
        dtype="float32",
    )
    return RouterConfig(**{**common, **fields})
