"""The RadixTree prefix cache: token runs -> KV page indices, shared by every request.

Contract (read before calling):
- Values are page indices from the PageAllocator; the tree never touches KV buffers.
- ``match_prefix`` MUTATES: it may split a node and it refreshes access times.
- Pages from a match are valid only while its node is locked: lock before budgeting or
  evicting, unlock exactly the node that was locked. ``evict`` frees unlocked leaves only.
- With ``page_size`` P > 1 every node holds whole pages; matching and inserting stop at the
  last full page; children are keyed by their first page's tokens.
- A cache salt is part of the key: the same tokens under another salt never share. Salts
  that start alike form a namespace (a tenant's): it can be measured and evicted on its own.
- Every insert and every eviction goes through ``_emit`` (the one place to publish events).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from radixcluster.router.cache.eviction_heap import EvictionHeap, is_evictable_leaf
from radixcluster.router.cache.page_allocator import PageAllocator


class TreeNode:
    """One token run (whole pages) and its pages; the root has an empty key."""

    __slots__ = ("key", "value", "children", "parent", "salt", "lock_ref", "last_access", "hit_count", "heap_seq")

    def __init__(self, key: np.ndarray, value: np.ndarray, parent: TreeNode | None, salt: str) -> None:
        self.key = key  # int32 token ids, owned (never a view of a caller's buffer)
        self.value = value  # int32 page indices, len(key) // page_size of them
        self.children: dict = {}
        self.parent = parent
        self.salt = salt
        self.lock_ref = 0
        self.last_access = 0
        self.hit_count = 0
        self.heap_seq = -1  # sequence number of this node's live eviction-heap entry


class IntegrityError(RuntimeError):
    """A broken cache invariant: a bug, never a client's fault."""


def check(cond: bool, message: str) -> None:
    """Like assert, but never stripped by ``python -O``."""
    if not cond:
        raise IntegrityError(message)


class MatchResult(NamedTuple):
    pages: np.ndarray  # int32 pages of the matched prefix, one per page of tokens
    length: int  # matched tokens (a multiple of page_size)
    node: TreeNode  # the deepest matched node (the root when nothing matched): lock this


class InsertResult(NamedTuple):
    prefix_len: int  # tokens that were already cached before this insert
    pages: np.ndarray  # the tree's pages for the whole inserted (page-aligned) run
    node: TreeNode  # the node ending the inserted run (the root if it was shorter than a page)


TreeEventHook = Callable[[str, TreeNode], None]


class RadixTree:
    """Prefix cache over token ids; see the module docstring for the contract."""

    def __init__(
        self,
        allocator: PageAllocator,
        page_size: int = 1,
        eviction_policy: str = "lru",
        on_event: TreeEventHook | None = None,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.allocator = allocator
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        self._heap = EvictionHeap(eviction_policy)
        # called as on_event("insert" | "evict", node); the node is valid during the call only
        self.on_event = on_event
        empty = np.zeros(0, dtype=np.int32)
        self.root = TreeNode(empty, empty, None, "")
        self.root.lock_ref = 1  # the root is never evictable
        self.evictable_tokens = 0
        self.protected_tokens = 0
        self.node_count = 0  # excluding the root
        self.evicted_tokens_total = 0
        self._salt_tokens: dict[str, int] = {}  # cached tokens under each salt
        self._clock = 0

    # ------------------------------------------------------------ queries

    @property
    def cached_tokens(self) -> int:
        return self.evictable_tokens + self.protected_tokens

    @property
    def clock(self) -> int:
        """The logical time of the last match or insert (what ``last_access`` counts in)."""
        return self._clock

    @property
    def evictable_pages(self) -> int:
        return self.evictable_tokens // self.page_size

    def namespace_tokens(self, prefix: str) -> int:
        """Tokens cached under the salts that start with ``prefix``."""
        return sum(n for salt, n in self._salt_tokens.items() if salt.startswith(prefix))

    def match_prefix(self, tokens: np.ndarray, salt: str | None = None) -> MatchResult:
        """The longest cached page-aligned prefix of ``tokens`` under ``salt``.

        Mutates: splits the node where the match ends inside it, refreshes access times.
        The caller limits ``tokens`` (e.g. to ``prompt[:-1]``, so the last token is computed).
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        self._clock += 1
        node, length, pages = self._walk(tokens, salt or "")
        return MatchResult(_concat(pages), length, node)

    def _walk(self, tokens: np.ndarray, salt: str) -> tuple[TreeNode, int, list[np.ndarray]]:
        """Follow ``tokens`` down, splitting where the match ends mid-node."""
        ps = self.page_size
        limit = len(tokens) // ps * ps
        node, pos, pages = self.root, 0, []
        while pos < limit:
            child = node.children.get(self._child_key(node, tokens[pos : pos + ps], salt))
            if child is None:
                break
            n = _common_prefix_len(child.key, tokens[pos:limit]) // ps * ps
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            self._touch(child)
            pages.append(child.value)
            node, pos = child, pos + n
            if partial:
                break
        return node, pos, pages

    # ------------------------------------------------------------ mutation

    def insert(self, tokens: np.ndarray, pages: np.ndarray, salt: str | None = None) -> InsertResult:
        """Cache ``tokens[: len // P * P]`` backed by ``pages`` (one per page of tokens).

        Pages of the already-cached prefix stay the tree's: where ``pages`` differ there, the
        caller's are duplicates that it must free (after re-pointing its table at
        ``result.pages``). New pages are taken over by the tree (copied, never aliased).
        """
        tokens = np.asarray(tokens, dtype=np.int32)
        pages = np.asarray(pages, dtype=np.int32)
        salt = salt or ""
        ps = self.page_size
        limit = len(tokens) // ps * ps
        if len(pages) < limit // ps:
            raise ValueError(f"{limit} tokens need {limit // ps} pages, got {len(pages)}")
        self._clock += 1
        node, prefix_len, got = self._walk(tokens[:limit], salt)
        if prefix_len < limit:
            leaf = TreeNode(tokens[prefix_len:limit].copy(), pages[prefix_len // ps : limit // ps].copy(), node, salt)
            node.children[self._child_key(node, leaf.key[:ps], salt)] = leaf
            leaf.last_access = self._clock
            self.node_count += 1
            self.evictable_tokens += len(leaf.key)
            self._salt_tokens[salt] = self._salt_tokens.get(salt, 0) + len(leaf.key)
            self._push(leaf)
            self._emit("insert", leaf)
            got.append(leaf.value)
            node = leaf
        return InsertResult(prefix_len, _concat(got), node)

    def record_hit(self, node: TreeNode) -> None:
        """A request was admitted on the (locked) path to ``node``: count a hit on every node
        of it, LFU's frequency. Matches that merely order the queue count nothing."""
        for n in self.path(node):
            n.hit_count += 1

    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (one lock per running request)."""
        for n in self.path(node):
            if n.lock_ref == 0:
                self.evictable_tokens -= len(n.key)
                self.protected_tokens += len(n.key)
            n.lock_ref += 1

    def unlock(self, node: TreeNode) -> None:
        """Release a lock taken by ``lock(node)`` on the very same node."""
        for n in self.path(node):
            if n.lock_ref <= 0:
                raise RuntimeError("unlock of a node that is not locked")
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.evictable_tokens += len(n.key)
                self.protected_tokens -= len(n.key)
                self._push(n)

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves (by policy) until ``num_tokens`` tokens are freed or none is left.

        Whole nodes go, so it may free more than asked; ``evict(0)`` does nothing. Returns
        the tokens freed.
        """
        freed = 0
        while freed < num_tokens:
            node = self._heap.pop()
            if node is None:
                break
            freed += len(node.key)
            self._remove_leaf(node)
        return freed

    def evict_namespace(self, prefix: str, num_tokens: int) -> int:
        """``evict`` restricted to the runs whose salt starts with ``prefix``: their unlocked
        leaves go by policy until ``num_tokens`` are freed or none is left. Returns the tokens
        freed."""
        heap: list[tuple] = []
        order = itertools.count()  # ties by discovery; a plain heap, since the tree's own heap
        # marks the nodes it queues

        def offer(node: TreeNode) -> None:
            if is_evictable_leaf(node):
                heapq.heappush(heap, (self._heap.priority(node), next(order), node))

        stack = [c for c in self.root.children.values() if c.salt.startswith(prefix)]
        while stack:
            node = stack.pop()
            offer(node)
            stack.extend(node.children.values())
        freed = 0
        while freed < num_tokens and heap:
            node = heapq.heappop(heap)[2]
            parent = _parent(node)
            freed += len(node.key)
            self._remove_leaf(node)
            if parent is not self.root:
                offer(parent)
        return freed

    def evict_prefix(self, tokens: np.ndarray, salt: str | None = None) -> int:
        """Free the unlocked nodes of every cached run that starts with ``tokens`` (cut to whole
        pages): the subtree where that prefix ends, the node ending it included, never its
        ancestors (other runs share them). Nothing when the whole prefix is not cached, since
        then no cached run starts with it. Locked nodes (running requests, pins) and their
        ancestors stay. Returns the tokens freed."""
        tokens = np.asarray(tokens, dtype=np.int32)
        limit = len(tokens) // self.page_size * self.page_size
        match = self.match_prefix(tokens[:limit], salt)  # splits where the prefix ends mid-node
        if limit == 0 or match.length < limit:
            return 0
        order, stack = [], [match.node]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        freed = 0
        for node in reversed(order):  # children before their parent
            if not node.lock_ref and not node.children:
                freed += len(node.key)
                self._remove_leaf(node)
        return freed

    def reset(self) -> None:
        """Evict everything; only valid when nothing is locked."""
        if self.protected_tokens:
            raise RuntimeError("reset while requests hold locks")
        self.evict(self.evictable_tokens)

    def path_pages(self, node: TreeNode) -> np.ndarray:
        """The pages from the root down to ``node`` (what a lock on ``node`` protects)."""
        return _concat([n.value for n in self.path(node)][::-1])

    def path(self, node: TreeNode) -> Iterator[TreeNode]:
        """``node`` and its ancestors up to the root (excluded), deepest first."""
        walk: TreeNode | None = node
        while walk is not None and walk is not self.root:
            yield walk
            walk = walk.parent

    def check_integrity(self) -> np.ndarray:
        """Walk the tree, verify its structure and counters; return every page it owns.

        Raises IntegrityError on the first broken invariant.
        """
        ps, evictable, protected, nodes, owned = self.page_size, 0, 0, 0, []
        by_salt: dict[str, int] = {}
        stack = [self.root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for key, child in node.children.items():
                check(child.parent is node, "child with a wrong parent")
                check(len(child.key) > 0 and len(child.key) % ps == 0, "node run is not whole pages")
                check(len(child.value) * ps == len(child.key), "pages do not cover the run")
                check(key == self._child_key(node, child.key[:ps], child.salt), "child under a wrong key")
                child_locks += child.lock_ref
                stack.append(child)
            if node is self.root:
                continue
            check(node.lock_ref >= child_locks, "a child holds more locks than its parent")
            nodes += 1
            owned.append(node.value)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
            by_salt[node.salt] = by_salt.get(node.salt, 0) + len(node.key)
        counters = (self.evictable_tokens, self.protected_tokens, self.node_count)
        check(counters == (evictable, protected, nodes), f"counters {counters} != walk {(evictable, protected, nodes)}")
        check(self._salt_tokens == by_salt, f"tokens by salt {self._salt_tokens} != walk {by_salt}")
        pages = _concat(owned)
        check(not self.allocator.any_free(pages), "the tree owns a free page")
        return pages

    # ------------------------------------------------------------ internals

    def _child_key(self, parent: TreeNode, first_page: np.ndarray, salt: str) -> object:
        # the salt namespaces the root's children; below them every key shares it
        key = first_page.tobytes()
        return (salt, key) if parent is self.root else key

    def _touch(self, node: TreeNode) -> None:
        node.last_access = self._clock
        self._push(node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; the new parent inherits lock and access state."""
        ps = self.page_size
        parent = _parent(child)
        new = TreeNode(child.key[:n].copy(), child.value[: n // ps].copy(), parent, child.salt)
        new.lock_ref = child.lock_ref
        new.last_access = child.last_access
        new.hit_count = child.hit_count
        parent.children[self._child_key(parent, new.key[:ps], child.salt)] = new
        child.key = child.key[n:].copy()
        child.value = child.value[n // ps :].copy()
        child.parent = new
        new.children[self._child_key(new, child.key[:ps], child.salt)] = child
        self.node_count += 1
        return new

    def _push(self, node: TreeNode) -> None:
        self._heap.push(node)
        if self._heap.needs_rebuild(self.node_count):
            self._heap.rebuild(self._nodes())

    def _nodes(self) -> Iterator[TreeNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def _remove_leaf(self, node: TreeNode) -> None:
        self._emit("evict", node)
        parent = _parent(node)
        del parent.children[self._child_key(parent, node.key[: self.page_size], node.salt)]
        node.parent = None
        node.heap_seq = -1
        self.allocator.free(node.value)
        self.evictable_tokens -= len(node.key)
        self.evicted_tokens_total += len(node.key)
        left = self._salt_tokens[node.salt] - len(node.key)
        if left:
            self._salt_tokens[node.salt] = left
        else:
            del self._salt_tokens[node.salt]
        self.node_count -= 1
        self._push(parent)

    def _emit(self, kind: str, node: TreeNode) -> None:
        """The single choke point of tree events ("insert" a new leaf, "evict" a leaf)."""
        if self.on_event is not None:
            self.on_event(kind, node)


def _parent(node: TreeNode) -> TreeNode:
    if node.parent is None:
        raise IntegrityError("a node below the root without a parent")
    return node.parent


def _common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
