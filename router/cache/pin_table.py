"""Pinned prefixes: cached runs a user asked to keep for a while. A pin is one lock on the
RadixTree node where its prefix's cached part ends (so eviction skips the whole path), taken
and released only here; the pinned tokens (the union of the pinned paths) stay under a bound.

Contract: ``expire`` must be called regularly (the scheduler does, every schedule); a pin past
its TTL still protects its pages until then. ``clear`` before flushing the tree.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from radixcluster.router.cache.radix_tree import RadixTree, TreeNode

# pins are few (each is a request someone made on purpose); the bound keeps their walks cheap
MAX_PINS = 256


class PinRefused(ValueError):
    """A pin that cannot be taken (nothing cached, over the bound): the client's fault."""


@dataclass(slots=True)
class Pin:
    key: tuple[str, bytes]  # the cache salt and the requested token ids: what unpin names
    node: TreeNode  # the locked node: the end of the pinned (cached) part of the prefix
    tokens: int  # tokens from the root to ``node``
    prompt_tokens: int  # tokens asked for (the pinned part may be shorter)
    expires_at: float  # time.monotonic()

    def describe(self, now: float) -> dict:
        """What /cache_info lists: an id (a hash, never the text), sizes, time left."""
        name = hashlib.blake2b(self.key[0].encode() + self.key[1], digest_size=8).hexdigest()
        left = max(0.0, self.expires_at - now)
        return {"id": name, "tokens": self.tokens, "prompt_tokens": self.prompt_tokens, "expires_in_s": round(left, 3)}


class PinTable:
    """The pins of one tree; ``max_tokens`` bounds the union of their paths."""

    def __init__(self, tree: RadixTree, max_tokens: int) -> None:
        self.tree = tree
        self.max_tokens = max_tokens
        self._pins: dict[tuple[str, bytes], Pin] = {}
        self._next_expiry = math.inf

    def __len__(self) -> int:
        return len(self._pins)

    def pin(self, tokens: np.ndarray, salt: str | None, ttl_s: float, now: float) -> Pin:
        """Pin the cached part of ``tokens`` under ``salt`` until ``now + ttl_s``; pinning the
        same prefix again moves its lock to what is cached now and restarts its TTL. Raises
        PinRefused when nothing of it is cached, or the bound would be passed."""
        tokens = np.asarray(tokens, dtype=np.int32)
        key = (salt or "", tokens.tobytes())
        if key not in self._pins and len(self._pins) >= MAX_PINS:
            raise PinRefused(f"{MAX_PINS} prefixes are pinned already; unpin one first")
        match = self.tree.match_prefix(tokens, salt)
        if match.length == 0:
            raise PinRefused("nothing of this prefix is cached (it is shorter than a page, or was evicted)")
        others = [p.node for k, p in self._pins.items() if k != key]
        total = self._union_tokens([*others, match.node])
        if total > self.max_tokens:
            raise PinRefused(
                f"pinning these {match.length} tokens would pin {total} tokens in all, over the "
                f"{self.max_tokens} that --max-pinned-fraction allows; unpin something or pin less"
            )
        old = self._pins.pop(key, None)
        self.tree.lock(match.node)
        if old is not None:
            self.tree.unlock(old.node)
        pin = self._pins[key] = Pin(key, match.node, match.length, len(tokens), now + ttl_s)
        self._next_expiry = min(self._next_expiry, pin.expires_at)
        return pin

    def unpin(self, tokens: np.ndarray, salt: str | None) -> Pin | None:
        """Release the pin of exactly this prefix and salt; None when there is none."""
        pin = self._pins.pop((salt or "", np.asarray(tokens, dtype=np.int32).tobytes()), None)
        if pin is not None:
            self.tree.unlock(pin.node)
        return pin

    def expire(self, now: float) -> int:
        """Release the pins whose TTL ended; O(1) while none is due. Returns how many."""
        if now < self._next_expiry:
            return 0
        due = [k for k, p in self._pins.items() if p.expires_at <= now]
        for key in due:
            self.tree.unlock(self._pins.pop(key).node)
        self._next_expiry = min((p.expires_at for p in self._pins.values()), default=math.inf)
        return len(due)

    def release_soonest(self) -> Pin | None:
        """Release the pin whose TTL ends first (None when there is none)."""
        if not self._pins:
            return None
        key = min(self._pins, key=lambda k: self._pins[k].expires_at)
        pin = self._pins.pop(key)
        self.tree.unlock(pin.node)
        self._next_expiry = min((p.expires_at for p in self._pins.values()), default=math.inf)
        return pin

    def clear(self) -> None:
        for pin in self._pins.values():
            self.tree.unlock(pin.node)
        self._pins.clear()
        self._next_expiry = math.inf

    def pinned_tokens(self) -> int:
        """Tokens on the pinned paths, each counted once (pins share ancestors)."""
        return self._union_tokens([p.node for p in self._pins.values()])

    def pinned_node_ids(self) -> set[int]:
        """``id`` of every node a pin protects (the pinned nodes and their ancestors)."""
        return {id(n) for pin in self._pins.values() for n in self.tree.path(pin.node)}

    def describe(self, now: float, namespace: str | None = None) -> list[dict]:
        """Every pin, soonest to end first; with ``namespace``, those whose salt starts with it."""
        pins = sorted(self._pins.values(), key=lambda p: p.expires_at)
        return [p.describe(now) for p in pins if namespace is None or p.key[0].startswith(namespace)]

    def _union_tokens(self, nodes: list[TreeNode]) -> int:
        seen: dict[int, int] = {}
        for node in nodes:
            for n in self.tree.path(node):
                if id(n) in seen:
                    break  # the rest of this path is counted already
                seen[id(n)] = len(n.key)
        return sum(seen.values())
