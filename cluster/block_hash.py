"""Names of cached KV blocks, shared by the routers (who publish them) and the gateway (who
matches prompts against them): a page-aligned block of tokens is named by a 64-bit hash of
the cache salt and every token from the start of the sequence to the block's end, so one name
stands for the block together with its whole parent chain. A tenant's (--api-key-file) salt
is its own namespace (``tenant_salt``), so a gateway that knows the tenant names its blocks as
the router does.

The hash is a running sum of (token, position) terms, each a token's mixed value times a
position's (odd) mixed value: the state after any prefix is one number, the block names of a
run of tokens follow from the state before it in a few vectorized numpy operations (no Python
loop per token; the mixed values of small token ids and positions are looked up in tables, as
each numpy call costs more than the arithmetic on a prompt), and a router that knows the state
at a tree node's start names that node's blocks without walking its ancestors again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_POSITION_KEY = np.uint64(0xD6E8FEB86659FD93)  # positions and tokens are mixed apart
_ONE = np.uint64(1)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that spreads every input bit."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _MUL1
    x = (x ^ (x >> _S27)) * _MUL2
    return x ^ (x >> _S31)


def _position_terms(positions: np.ndarray) -> np.ndarray:
    return _mix(positions ^ _POSITION_KEY) | _ONE


class _Memo:
    """The values of ``term`` for 0 .. n-1, grown as larger arguments come, up to ``limit``
    entries; arguments past it are computed each time (a forged huge token id must not grow
    the table)."""

    def __init__(self, term: Callable[[np.ndarray], np.ndarray], limit: int) -> None:
        self._term = term
        self._limit = limit
        self._values = term(np.arange(1024, dtype=np.uint64))

    def _cover(self, top: int) -> bool:
        """Whether the table holds ``top`` (grown to it if it may)."""
        if top < len(self._values):
            return True
        if top >= self._limit:
            return False
        self._values = self._term(np.arange(min(self._limit, 1 << top.bit_length()), dtype=np.uint64))
        return True

    def of(self, args: np.ndarray) -> np.ndarray:
        """``term(args)`` (uint64 ``args``)."""
        return self._values[args] if self._cover(int(args.max())) else self._term(args)

    def run(self, start: int, end: int) -> np.ndarray:
        """``term`` of ``start`` .. ``end`` - 1."""
        if self._cover(end - 1):
            return self._values[start:end]
        return self._term(np.arange(start, end, dtype=np.uint64))


# vocabularies and contexts to 2**20 (8 MiB a table)
_TOKENS = _Memo(_mix, 1 << 20)
_POSITIONS = _Memo(_position_terms, 1 << 20)


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
    # array arithmetic on uint64 wraps silently (numpy warns only on scalars)
    terms = _TOKENS.of(ids) * _POSITIONS.run(start, start + ids.size)
    terms[:1] += np.uint64(state)
    running = np.cumsum(terms, out=terms)
    return running[page_size - 1 :: page_size][: ids.size // page_size], int(running[-1])


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
