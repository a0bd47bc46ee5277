"""Where `radixcluster up --dp-size N` puts its replicas (on the live nodes that can host a TP
group, the driver's node first, then in turn) and which keys it gives them."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixcluster.data_parallel import (
    MAX_RESTARTS,
    REPLICA_OWN_FLAGS,
    STABLE_S,
    ClusterKeys,
    ReplicaExits,
    cluster_keys,
    replica_nodes,
)
from radixcluster.ray_cluster import RayPlacementError
from radixcluster.server_args import ServerArgs, replica_argv


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


@pytest.fixture()
def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys.json"
    path.write_text('{"ka": {"tenant": "alpha"}}')
    return str(path)


def test_replicas_get_the_tenants_file_as_a_flag_and_the_keys_only_in_their_environment(keys_file):
    args = ServerArgs(dp_size=2, api_key="k-secret", admin_api_key="boss-secret", api_key_file=keys_file)
    argv = replica_argv(args, REPLICA_OWN_FLAGS)
    assert argv == ["--api-key-file", keys_file]  # the keys go through the environment: ps shows no key


def test_the_commands_own_calls_carry_the_api_key_else_the_admin_key_else_a_fresh_one(keys_file):
    assert cluster_keys(ServerArgs(dp_size=2)) == ClusterKeys(None, None)
    assert cluster_keys(ServerArgs(dp_size=2, api_key="k", api_key_file=keys_file)) == ClusterKeys("k", "k")
    assert cluster_keys(ServerArgs(dp_size=2, admin_api_key="boss", api_key_file=keys_file)) == ClusterKeys(
        None, "boss"
    )
    # tenants' keys alone: no client key would do for the gateway's polls, so a key no client holds
    fresh, other = (cluster_keys(ServerArgs(dp_size=2, api_key_file=keys_file)) for _ in range(2))
    assert fresh.api_key == fresh.own and len(fresh.own or "") >= 32 and fresh.own != other.own


def test_a_replicas_exits_count_in_a_row_and_a_long_serve_starts_the_count_again():
    """An occasional exit over a long life never adds up to the limit; quick exits in a row do."""
    exits = ReplicaExits(serving_since=0.0)
    t = 0.0
    for _ in range(3 * MAX_RESTARTS):  # each after an hour of serving: always the first of its row
        t += 3600
        assert exits.exited(t) == 1
        exits.back(t + 10)
    # the last of those began a row: quick exits after it (never serving long) add up to past the limit
    quick = [exits.exited(t + 10 + k) for k in range(1, MAX_RESTARTS + 1)]
    assert quick == list(range(2, MAX_RESTARTS + 2)) and quick[-1] > MAX_RESTARTS
    exits.back(t + 100)
    assert exits.exited(t + 100 + STABLE_S) == 1
