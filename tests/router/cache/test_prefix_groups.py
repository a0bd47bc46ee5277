"""Shared-prefix groups from real radix-tree nodes: the deepest node two requests share."""

from __future__ import annotations

import numpy as np

from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.prefix_groups import prefix_groups
from radixcluster.router.cache.radix_tree import RadixTree, TreeNode


def cached(tree: RadixTree, alloc: PageAllocator, tokens: list[int]) -> TreeNode:
    """Insert ``tokens`` and return the node a request holding them would lock."""
    match = tree.match_prefix(np.array(tokens))
    fresh = alloc.alloc((len(tokens) - match.length) // tree.page_size)
    return tree.insert(np.array(tokens), np.concatenate([match.pages, fresh])).node


def test_requests_join_the_deepest_node_they_share() -> None:
    alloc = PageAllocator(200)
    tree = RadixTree(alloc, 1)
    system_a, system_b = list(range(10, 30)), list(range(50, 62))
    a1 = cached(tree, alloc, system_a + [1, 2, 3])
    a2 = cached(tree, alloc, system_a + [4, 5])
    # c1 and c2 branch off after the first 8 system tokens: they share those with a1 and a2
    # too, but a1 and a2 share more between themselves
    c1 = cached(tree, alloc, system_a[:8] + [99, 98])
    c2 = cached(tree, alloc, system_a[:8] + [97])
    b1 = cached(tree, alloc, system_b + [7])
    b2 = cached(tree, alloc, system_b + [8, 9])
    loner = cached(tree, alloc, [500, 501])
    groups, lens = prefix_groups([a1, b1, a2, loner, b2, None, tree.root, c1, c2], [1] * 9)
    assert groups.dtype == np.int32 and lens.dtype == np.int32
    a, b, c = groups[0], groups[1], groups[7]
    assert groups.tolist() == [a, b, a, -1, b, -1, -1, c, c]
    assert len({a, b, c}) == 3 and lens[a] == len(system_a) and lens[b] == len(system_b) and lens[c] == 8


def test_no_sharing_is_none() -> None:
    alloc = PageAllocator(50)
    tree = RadixTree(alloc, 4)
    assert (
        prefix_groups([cached(tree, alloc, list(range(8))), cached(tree, alloc, list(range(20, 28))), None], [1] * 3)
        is None
    )
    assert prefix_groups([], []) is None


def test_a_request_left_alone_at_a_shallower_node_reads_alone() -> None:
    alloc = PageAllocator(100)
    tree = RadixTree(alloc, 1)
    system = list(range(10, 40))
    deep = [cached(tree, alloc, system + [i, i + 1]) for i in (1, 3)]
    shallow = cached(tree, alloc, system[:24] + [77])
    groups, lens = prefix_groups([shallow, *deep], [1] * 3)
    assert groups.tolist() == [-1, 0, 0] and lens.tolist() == [30]


def test_a_group_whose_queries_outnumber_the_key_reads_it_saves_reads_alone() -> None:
    """Four prefills sharing a chat template's first 3 tokens would merge 2,564 query rows to
    save 9 key reads: no group. Four questions of 24 tokens after a shared 620: a group."""
    alloc = PageAllocator(4000)
    tree = RadixTree(alloc, 1)
    template = [1, 2, 3]
    leaders = [cached(tree, alloc, template + list(range(100 * i, 100 * i + 20))) for i in range(1, 5)]
    assert prefix_groups(leaders, [641] * 4) is None
    assert prefix_groups(leaders, [3, 3, 3, 1]) is None  # 10 query rows for 9 reads saved
    groups, lens = prefix_groups(leaders, [3, 3, 2, 1])  # 9 for 9
    assert groups.tolist() == [0] * 4 and lens.tolist() == [3]
    system = list(range(1000, 1620))
    followers = [cached(tree, alloc, system + [i]) for i in range(4)]
    groups, lens = prefix_groups(followers, [24] * 4)
    assert groups.tolist() == [0] * 4 and lens.tolist() == [620]
    # both kinds in one batch: only the one worth it is grouped
    groups, lens = prefix_groups([*leaders, *followers], [641] * 4 + [24] * 4)
    assert groups.tolist() == [-1] * 4 + [0] * 4 and lens.tolist() == [620]
