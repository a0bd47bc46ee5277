"""The cache page's tree snapshot: bounded by depth, size and node count, no token text."""

from __future__ import annotations

import numpy as np
import pytest

from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree
from radixcluster.router.cache.tree_snapshot import SnapshotBounds, tree_snapshot


def _tree(prompts: list[list[int]], salt: str | None = None) -> RadixTree:
    alloc = PageAllocator(1000)
    tree = RadixTree(alloc)
    for p in prompts:
        tree.insert(np.asarray(p), alloc.alloc(len(p)), salt)
    return tree


def _walk(node: dict) -> list[dict]:
    out = [node]
    for c in node["children"]:
        out += _walk(c)
    return out


def test_shared_prefix_is_one_node_with_the_sizes_of_its_subtree():
    tree = _tree([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9]])
    tree.record_hit(tree.match_prefix(np.asarray([1, 2, 3, 4, 5])).node)
    snap = tree_snapshot(tree, SnapshotBounds())
    (shared,) = snap["root"]["children"]
    assert (shared["tokens"], shared["subtree_tokens"], shared["hits"]) == (3, 8, 1)
    assert sorted(c["tokens"] for c in shared["children"]) == [2, 3]
    assert snap["nodes"] == 3 and not snap["truncated"]
    assert snap["root"]["subtree_tokens"] == tree.cached_tokens


def test_depth_and_min_tokens_fold_what_they_leave_out():
    tree = _tree([[1, 2, 3, 4, 5], [1, 2, 3, 9, 9, 9], [7]])
    snap = tree_snapshot(tree, SnapshotBounds(depth=1, min_tokens=2))
    (shared,) = snap["root"]["children"]
    assert shared["children"] == [] and shared["folded_tokens"] == 5
    assert snap["root"]["folded_tokens"] == 1  # the one-token prompt [7]


def test_the_node_cap_keeps_the_biggest_and_says_it_cut():
    tree = _tree([[i, i + 1000] for i in range(50)] + [[5000] * 10])
    snap = tree_snapshot(tree, SnapshotBounds(max_nodes=5))
    assert snap["nodes"] == 5 and snap["truncated"]
    assert snap["root"]["children"][0]["subtree_tokens"] == 10
    shown = sum(n["tokens"] for n in _walk(snap["root"]))
    folded = sum(n["folded_tokens"] for n in _walk(snap["root"]))
    assert shown + folded == tree.cached_tokens


def test_salts_are_hashed_and_ids_differ_across_salts():
    a = tree_snapshot(_tree([[1, 2, 3]], "tenant-a"), SnapshotBounds())["root"]["children"][0]
    b = tree_snapshot(_tree([[1, 2, 3]], "tenant-b"), SnapshotBounds())["root"]["children"][0]
    assert a["id"] != b["id"] and a["salt"] != b["salt"]
    assert "tenant" not in repr(a) + repr(b)


@pytest.mark.parametrize("bad", [{"depth": 0}, {"min_tokens": -1}, {"max_nodes": 10**6}])
def test_bounds_are_checked(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SnapshotBounds(**bad)


def test_text_and_pins_appear_only_when_asked():
    tree = _tree([[1, 2, 3], [1, 2, 3, 4, 5]])
    plain = tree_snapshot(tree, SnapshotBounds())["root"]["children"][0]
    assert "text" not in plain and not plain["pinned"]
    node = tree.match_prefix(np.asarray([1, 2, 3])).node
    labelled = tree_snapshot(tree, SnapshotBounds(), label=lambda key: ",".join(map(str, key)), pinned={id(node)})
    (shared,) = labelled["root"]["children"]
    assert (shared["text"], shared["pinned"]) == ("1,2,3", True)
    assert (shared["children"][0]["text"], shared["children"][0]["pinned"]) == ("4,5", False)


def test_a_salt_prefix_shows_one_namespace_only():
    alloc = PageAllocator(100)
    tree = RadixTree(alloc)
    for salt, tokens in (("a:1", [1, 2, 3]), ("a:2", [4, 5]), ("b:1", [1, 2, 3, 4])):
        tree.insert(np.asarray(tokens), alloc.alloc(len(tokens)), salt)
    snap = tree_snapshot(tree, SnapshotBounds(), salt_prefix="a:")
    assert snap["root"]["subtree_tokens"] == 5 and snap["nodes"] == 2
    assert tree_snapshot(tree, SnapshotBounds())["root"]["subtree_tokens"] == 9
