"""A bounded JSON picture of the RadixTree for the cache page: nodes down to a depth, small
subtrees folded, at most a fixed number of nodes, prefixes named by hash and token count (and
by their first tokens' text only when the caller passes a ``label``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from radixcluster.router.cache.radix_tree import RadixTree, TreeNode

MAX_SNAPSHOT_NODES = 512


@dataclass(slots=True, frozen=True)
class SnapshotBounds:
    """``depth``: levels below the root; ``min_tokens``: subtrees smaller than this are folded
    into their parent's ``folded_tokens``; ``max_nodes``: a hard cap on the nodes returned."""

    depth: int = 8
    min_tokens: int = 0
    max_nodes: int = MAX_SNAPSHOT_NODES

    def __post_init__(self) -> None:
        if not 1 <= self.depth <= 64:
            raise ValueError(f"depth must be in [1, 64], got {self.depth}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if not 1 <= self.max_nodes <= MAX_SNAPSHOT_NODES:
            raise ValueError(f"max_nodes must be in [1, {MAX_SNAPSHOT_NODES}], got {self.max_nodes}")


def subtree_tokens(root: TreeNode) -> dict[int, int]:
    """Tokens cached in each node's subtree (itself included), by ``id(node)``; one walk."""
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    sizes: dict[int, int] = {}
    for node in reversed(order):  # children before their parent
        sizes[id(node)] = len(node.key) + sum(sizes[id(c)] for c in node.children.values())
    return sizes


def tree_snapshot(
    tree: RadixTree,
    bounds: SnapshotBounds,
    label: Callable[[np.ndarray], str] | None = None,
    pinned: Collection[int] = (),
    salt_prefix: str | None = None,
) -> dict[str, Any]:
    """The tree as nested nodes, breadth first so the cap keeps the top of the tree.

    Each node: ``id`` (a hash of its salt and tokens from the root), ``tokens`` (its own run),
    ``subtree_tokens``, ``hits``, ``age`` (ticks of the tree's clock since its last access),
    ``locked``, ``pinned`` (its ``id(node)`` is in ``pinned``), ``salt`` (a hash, never the
    salt), ``folded_tokens`` (what was left out below it), ``children``, and ``text`` (``label``
    of its token run) when a label is given. ``truncated`` says whether the node cap cut the
    walk short. With ``salt_prefix`` only the runs whose salt starts with it are shown (one
    tenant's), and the root counts only theirs."""
    sizes = subtree_tokens(tree.root)
    clock = tree.clock
    top: dict[str, Any] = {"id": "root", "tokens": 0, "subtree_tokens": sizes[id(tree.root)], "children": []}
    top["folded_tokens"] = 0
    queue: list[tuple[TreeNode, dict[str, Any], int, bytes]] = [(tree.root, top, 0, b"")]
    count, truncated = 0, False
    while queue:
        node, out, level, digest = queue.pop(0)
        kids = sorted(node.children.values(), key=lambda c: -sizes[id(c)])
        if level == 0 and salt_prefix is not None:
            kids = [c for c in kids if c.salt.startswith(salt_prefix)]
            top["subtree_tokens"] = sum(sizes[id(c)] for c in kids)
        for child in kids:
            size = sizes[id(child)]
            if level + 1 > bounds.depth or size < bounds.min_tokens or count >= bounds.max_nodes:
                truncated |= count >= bounds.max_nodes and size >= bounds.min_tokens and level + 1 <= bounds.depth
                out["folded_tokens"] += size
                continue
            count += 1
            child_digest = hashlib.blake2b(digest + child.salt.encode() + child.key.tobytes(), digest_size=8).digest()
            entry = {
                "id": child_digest.hex(),
                "tokens": len(child.key),
                "subtree_tokens": size,
                "hits": child.hit_count,
                "age": clock - child.last_access,
                "locked": child.lock_ref > 0,
                "pinned": id(child) in pinned,
                "salt": hashlib.blake2b(child.salt.encode(), digest_size=4).hexdigest() if child.salt else "",
                "folded_tokens": 0,
                "children": [],
            }
            if label is not None:
                entry["text"] = label(child.key)
            out["children"].append(entry)
            queue.append((child, entry, level + 1, child_digest))
    return {"root": top, "nodes": count, "truncated": truncated}
