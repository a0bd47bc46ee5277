"""`radixcluster up --dp-size 2` on a Ray cluster of two nodes (a head and a second
`ray start`, on two loopback addresses of this machine): one replica on each node, each
listening on its node's address, behind one gateway that uses both."""

from __future__ import annotations

import pytest

from support.api_helpers import post
from support.ray_nodes import ray_head, ray_node
from support.servers import launch_server, wait_replicas

pytestmark = pytest.mark.slow


def test_two_nodes_one_replica_each_behind_one_gateway() -> None:
    with (
        ray_head(num_cpus=2, node_ip="127.0.0.2") as address,
        ray_node(address, "127.0.0.3", num_cpus=2),
        launch_server("--dp-size", "2", "--ray-address", address, "--max-total-tokens", "2048") as gateway,
    ):
        listed = wait_replicas(gateway, 2)
        hosts = sorted(r["url"].rsplit(":", 1)[0] for r in listed)
        assert hosts == ["http://127.0.0.2", "http://127.0.0.3"]
        assert all(r["events_address"].startswith(r["url"].rsplit(":", 1)[0].replace("http", "tcp")) for r in listed)
        served = set()
        # prompts that differ from their first token: nothing is cached anywhere, they take turns
        for text in ("Apples grow on trees.", "Quantum physics is hard.", "Paris is in France.", "Seven and five."):
            body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
            resp = post(gateway, "/generate", body)
            assert resp.status_code == 200, resp.text
            served.add(resp.json()["meta_info"]["replica"])
        assert served == {r["url"] for r in listed}
