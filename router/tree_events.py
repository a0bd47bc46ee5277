"""The radix tree's inserts and evictions as numbered TreeEvent messages (block names, not
pages), for the gateways that route by what each replica has cached; and the snapshot a
gateway resyncs from when it missed some.

It hangs on ``RadixTree``'s one event hook. A node's block names follow from the hash state
at its start, which is the state at its parent's end: states are remembered per node, so an
insert hashes only the new node's tokens. A split does not disturb them (the lower half keeps
its end, the new upper half is computed from its parent when first needed).
"""

from __future__ import annotations

import uuid

import numpy as np

from radixcluster.block_hash import extend, initial_state
from radixcluster.protocol import PROTOCOL_VERSION, TreeEvent
from radixcluster.router.cache.radix_tree import TreeNode


class TreeEventLog:
    """Turns tree events into TreeEvent messages, kept in ``outbox`` until the router process
    publishes them; ``address`` is where they are published (set by the router process)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.instance = uuid.uuid4().hex
        self.seq = 0
        self.address: str | None = None
        self.outbox: list[TreeEvent] = []
        self._ends: dict[TreeNode, tuple[int, int]] = {}  # node -> (position, hash state) at its end

    def on_event(self, kind: str, node: TreeNode) -> None:
        """The RadixTree hook: ``kind`` "insert" or "evict" of the leaf ``node``."""
        start, state = self._start(node)
        blocks, end_state = extend(state, node.key, start, self.page_size)
        if kind == "evict":
            self._ends.pop(node, None)
        else:
            self._ends[node] = (start + len(node.key), end_state)
        self.seq += 1
        self.outbox.append(TreeEvent(self.instance, self.seq, kind, blocks))

    def drain(self) -> list[TreeEvent]:
        events, self.outbox = self.outbox, []
        return events

    def snapshot(self, root: TreeNode) -> dict[str, object]:
        """Every block the tree under ``root`` holds, as of event ``seq``."""
        blocks: list[np.ndarray] = []
        stack = [(child, 0, initial_state(child.salt)) for child in root.children.values()]
        while stack:
            node, start, state = stack.pop()
            names, end_state = extend(state, node.key, start, self.page_size)
            blocks.append(names)
            end = start + len(node.key)
            stack.extend((child, end, end_state) for child in node.children.values())
        names = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint64)
        return {
            "instance": self.instance,
            "seq": self.seq,
            "page_size": self.page_size,
            "protocol": PROTOCOL_VERSION,  # how the blocks are named (a gateway checks it)
            "blocks": names,
        }

    def _start(self, node: TreeNode) -> tuple[int, int]:
        """Position and hash state where ``node``'s run begins (its parent's end)."""
        unknown: list[TreeNode] = []  # ancestors whose end is not remembered yet, deepest first
        walk = node.parent
        while walk is not None and walk.parent is not None and walk not in self._ends:
            unknown.append(walk)
            walk = walk.parent
        if walk is None or walk.parent is None:  # reached the root
            known = (0, initial_state(node.salt))
        else:
            known = self._ends[walk]
        for ancestor in reversed(unknown):
            start, state = known
            known = self._ends[ancestor] = (
                start + len(ancestor.key),
                extend(state, ancestor.key, start, self.page_size)[1],
            )
        return known
