"""`radixcluster up --ray-address` joins a Ray head started apart from it (with Ray's token
authentication when the cluster has it), leaves it running, and refuses at once a cluster that
cannot host its tensor-parallel group."""

from __future__ import annotations

import secrets
import subprocess
import time

import pytest

from support.api_helpers import generate
from support.ray_nodes import ray_head
from support.servers import free_port, launch_server, radixcluster_command

pytestmark = pytest.mark.slow


def test_up_joins_a_token_authenticated_ray_cluster_and_leaves_it_running():
    token = secrets.token_hex(16)
    with (
        ray_head(num_cpus=2, token=token) as address,
        launch_server("--ray-address", address, env={"RAY_AUTH_TOKEN": token}) as srv,
    ):
        assert generate(srv, "The capital of France is", max_new_tokens=4)["meta_info"]["completion_tokens"] == 4


def test_a_cluster_without_room_fails_fast_with_a_message():
    with ray_head(num_cpus=0) as address:
        start = time.monotonic()
        done = subprocess.run(
            [*radixcluster_command(), "up", "--port", str(free_port()), "--ray-address", address],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 2
        assert "cannot host --tp-size 1" in done.stderr and "CPU" in done.stderr
        assert time.monotonic() - start < 120
