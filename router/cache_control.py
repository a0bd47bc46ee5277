"""The router's answers to the cache page and the cache-control calls: a bounded snapshot of
the tree, pin, unpin, and evict by prefix. A prefix is tokenized as /generate would tokenize it,
so it names the very runs that prompt cached."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from radixcluster.block_hash import tenant_namespace, tenant_salt
from radixcluster.protocol import ControlRequest, ControlResponse, GenerateRequest, SamplingParams
from radixcluster.router.cache.cache_manager import CacheManager
from radixcluster.router.cache.tree_snapshot import SnapshotBounds, tree_snapshot
from radixcluster.router.request_intake import RequestIntake

# with --cache-page-text, each node of the snapshot shows the text of its first tokens
LABEL_TOKENS = 8


class CacheControl:
    """Answers the ``CACHE_KINDS`` of ControlRequest; what the client got wrong (bad bounds, a
    prefix that cannot be pinned) is an error answer, for the api's 400."""

    def __init__(self, cache: CacheManager, intake: RequestIntake, with_text: bool) -> None:
        self.cache = cache
        self.intake = intake
        self.with_text = with_text

    def answer(self, msg: ControlRequest) -> ControlResponse:
        handlers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "cache_tree": self.tree,
            "cache_pin": self.pin,
            "cache_unpin": self.unpin,
            "cache_evict": self.evict,
        }
        try:
            return ControlResponse(msg.cid, handlers[msg.kind](msg.args))
        except ValueError as exc:  # PinRefused, RequestRejected, ForgedSalt, SnapshotBounds' checks
            return ControlResponse(msg.cid, error=str(exc))

    def tree(self, args: dict[str, Any]) -> dict[str, Any]:
        """``{root, nodes, truncated}`` (tree_snapshot) and the tree's ``clock``; ``args``:
        ``depth``, ``min_tokens``."""
        bounds = SnapshotBounds(depth=int(args.get("depth", 8)), min_tokens=int(args.get("min_tokens", 0)))
        tokenizer = self.intake.tokenizer
        label = (lambda key: tokenizer.decode(key[:LABEL_TOKENS].tolist())) if self.with_text else None
        tree = self.cache.tree
        # a tenant sees its own runs only
        own = tenant_namespace(args["tenant"]) if args.get("tenant") is not None else None
        snapshot = tree_snapshot(tree, bounds, label, self.cache.pins.pinned_node_ids(), own)
        return {**snapshot, "clock": tree.clock, "page_size": tree.page_size, "text": self.with_text}

    def pin(self, args: dict[str, Any]) -> dict[str, Any]:
        tokens = self._prefix(args)
        pin = self.cache.pin(tokens, _salt(args), float(args["ttl_s"]), time.monotonic())
        return {**pin.describe(time.monotonic()), "pinned_tokens": self.cache.pins.pinned_tokens()}

    def unpin(self, args: dict[str, Any]) -> dict[str, Any]:
        """``unpinned``: whether a pin of exactly this prefix (and salt) was there."""
        pin = self.cache.unpin(self._prefix(args), _salt(args))
        return {"unpinned": pin is not None, "tokens": pin.tokens if pin is not None else 0}

    def evict(self, args: dict[str, Any]) -> dict[str, Any]:
        """A text's runs are those of every text that starts with it: its last piece, which what
        follows may extend, is left out of the prefix."""
        text = args.get("text")
        if isinstance(text, str):
            args = {**args, "text": text[: self.intake.tokenizer.shared_by_continuations(text)]}
        tokens = self._prefix(args)
        freed = self.cache.evict_prefix(tokens, _salt(args))
        return {"prompt_tokens": len(tokens), "evicted_tokens": freed}

    def _prefix(self, args: dict[str, Any]) -> np.ndarray:
        """The token ids of ``args["text"]`` (as /generate encodes a text) or ``args["input_ids"]``."""
        msg = GenerateRequest(
            rid="",
            sampling=SamplingParams(),
            text=args.get("text"),
            input_ids=args.get("input_ids"),
            cache_salt=args.get("cache_salt"),
            tenant=args.get("tenant"),
        )
        return self.intake.prompt(msg)[1]


def _salt(args: dict[str, Any]) -> str | None:
    """The prefix's namespace: its ``cache_salt`` within the caller's ``tenant``, as for /generate."""
    return tenant_salt(args.get("tenant"), args.get("cache_salt"))
