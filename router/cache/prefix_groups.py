"""Which requests of a batch share a cached prefix, from the radix-tree nodes they hold locked,
so attention can read each shared prefix once per group (``ForwardBatch.prefix_groups``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from radixcluster.router.cache.radix_tree import TreeNode


def prefix_groups(locked: Sequence[TreeNode | None], new_tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
    """Each request's group and each group's shared length, for requests whose locked nodes
    are ``locked`` (the deepest node of their cached prefix; None or the root: nothing cached)
    and which compute ``new_tokens`` query tokens this step.

    A request joins the group of the deepest node on its path that another request's path
    also passes (when at least one other request chose that node too): every request of
    that group holds the tokens from the root through that node on the same pages. A group
    is kept only while its members' query tokens are at most the key rows it saves reading
    ((members - 1) x shared tokens): each of those tokens pays a merge of two partial results.
    Prefills of different system prompts share a chat template's first 3 tokens; grouped, the
    prefill steps of a shared-prefix run spent 530 ms in attention, ungrouped 430. Returns int32
    ``[B]`` (the group, -1 for none) and int32 ``[G]`` (tokens shared), or None when no two
    requests share a node worth it."""
    paths: list[list[TreeNode]] = []
    passes: dict[TreeNode, int] = {}
    for node in locked:
        path = []
        while node is not None and node.parent is not None:
            path.append(node)
            passes[node] = passes.get(node, 0) + 1
            node = node.parent
        paths.append(path)
    # the deepest node each request shares; a node only one request chose (the others sharing
    # it went deeper together) would make a group of one: that request reads alone
    chosen = [next((node for node in path if passes[node] > 1), None) for path in paths]
    members: dict[TreeNode, int] = {}
    queries: dict[TreeNode, int] = {}
    for node, tokens in zip(chosen, new_tokens):
        if node is not None:
            members[node] = members.get(node, 0) + 1
            queries[node] = queries.get(node, 0) + int(tokens)
    group_of = np.full(len(paths), -1, dtype=np.int32)
    index: dict[TreeNode, int] = {}
    lens: list[int] = []
    for b, (path, node) in enumerate(zip(paths, chosen)):
        if node is None or members[node] < 2:
            continue
        if node not in index:
            shared = sum(len(n.key) for n in path[path.index(node) :])
            worth = queries[node] <= (members[node] - 1) * shared
            index[node] = len(lens) if worth else -1
            if worth:
                lens.append(shared)
        group_of[b] = index[node]
    return (group_of, np.array(lens, dtype=np.int32)) if lens else None
