"""Fixtures of the gateway tests."""

from __future__ import annotations

import pytest

from radixcluster.gateway.config import HealthTunables
from radixcluster.gateway.replica import Replica
from support.tree_replica import TreeReplica


@pytest.fixture()
def make_replica():
    """Replicas whose views follow real radix trees (``page_size`` tokens per page)."""

    def make(url: str = "http://127.0.0.1:1", page_size: int = 4) -> TreeReplica:
        return TreeReplica(page_size, Replica(url, HealthTunables()))

    return make
