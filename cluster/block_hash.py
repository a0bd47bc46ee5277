"""Names of cached KV blocks, shared by the routers (who publish them) and the gateway (who
matches prompts against them): a page-aligned block of tokens is named by a 64-bit hash of
the cache salt and every token from the start of the sequence to the block's end, so one name
stands for the block together with its whole parent chain. A tenant's (--api-key-file) salt
is its own namespace (``tenant_salt``), so a gateway that knows the tenant names its blocks as
the router does.

The hash is a running sum of mixed (position, token) terms: the state after any prefix is
one number, the block names of a run of tokens follow from the state before it in a few
vectorized numpy operations (no Python loop per token), and a router that knows the state at
a tree node's start names that node's blocks without walking its ancestors again.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _MUL1
    x = (x ^ (x >> _S27)) * _MUL2
    return x ^ (x >> _S31)


def initial_state(salt: str | None) -> int:
    """The state before the first token of a sequence cached under ``salt`` (None is "")."""
    digest = hashlib.blake2b((salt or "").encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def extend(state: int, tokens: np.ndarray, start: int, page_size: int) -> tuple[np.ndarray, int]:
    """The names of the blocks of ``tokens`` (placed at position ``start``, a multiple of
    ``page_size``, after a prefix whose state is ``state``) that end on a page boundary, and
    the state after all of ``tokens``.

    Returns uint64 names, one per full page of ``tokens``, and the new state (a Python int).
    """
    ids = np.asarray(tokens, dtype=np.uint64).reshape(-1)
    if ids.size == 0:
        return np.zeros(0, dtype=np.uint64), state
    positions = np.arange(start, start + ids.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        running = np.cumsum(_mix((ids << _S32) | positions), dtype=np.uint64) + np.uint64(state)
        ends = running[page_size - 1 :: page_size][: ids.size // page_size]
        return _mix(ends), int(running[-1])


def prefix_block_hashes(tokens: np.ndarray, page_size: int, salt: str | None) -> np.ndarray:
    """The names of every full page of ``tokens`` from the start of the sequence."""
    return extend(initial_state(salt), tokens, 0, page_size)[0]


# a tenant's cache namespace starts with this; a salt sent without a tenant may not, so no
# client can name another tenant's prefixes
TENANT_SALT_PREFIX = "\x00tenant\x00"


class ForgedSalt(ValueError):
    """A cache salt, sent without a tenant, that names a tenant's namespace."""


def tenant_salt(tenant: str | None, cache_salt: str | None) -> str | None:
    """The tree's cache salt of a request: the client's, inside its tenant's namespace if any."""
    if tenant is None:
        if cache_salt is not None and cache_salt.startswith(TENANT_SALT_PREFIX):
            raise ForgedSalt("cache_salt (with extra_key) may not start with the bytes \\x00tenant\\x00")
        return cache_salt
    return tenant_namespace(tenant) + (cache_salt or "")


def tenant_namespace(tenant: str) -> str:
    """What every cache salt of ``tenant`` starts with (no tenant name holds \\x00)."""
    return f"{TENANT_SALT_PREFIX}{tenant}\x00"
