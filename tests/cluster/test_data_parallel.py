"""Where `radixcluster up --dp-size N` puts its replicas: on the live nodes that can host a TP
group, the driver's node first, then in turn."""

from __future__ import annotations

import pytest

from radixcluster.data_parallel import replica_nodes
from radixcluster.ray_cluster import RayPlacementError


def node(ip: str, cpus: float = 2, gpus: float = 0, alive: bool = True) -> dict:
    return {"NodeManagerAddress": ip, "Alive": alive, "Resources": {"CPU": cpus, "GPU": gpus}}


def test_replicas_spread_over_the_nodes_the_drivers_first():
    nodes = [node("10.0.0.3"), node("10.0.0.1"), node("10.0.0.2", alive=False)]
    assert replica_nodes(nodes, 3, 1, use_gpu=False, first="10.0.0.1") == ["10.0.0.1", "10.0.0.3", "10.0.0.1"]


def test_only_nodes_with_the_gpus_of_a_tp_group_get_a_replica():
    nodes = [node("10.0.0.1", gpus=1), node("10.0.0.2", gpus=8), node("10.0.0.3", gpus=4)]
    assert replica_nodes(nodes, 2, 4, use_gpu=True, first="10.0.0.1") == ["10.0.0.2", "10.0.0.3"]
    with pytest.raises(RayPlacementError, match="--tp-size 16"):
        replica_nodes(nodes, 2, 16, use_gpu=True, first="10.0.0.1")
