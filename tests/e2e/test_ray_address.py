"""`radixcluster up --ray-address` joins a Ray head started apart from it (with Ray's token
authentication when the cluster has it), leaves it running, and refuses at once a cluster that
cannot host its tensor-parallel group."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.api_helpers import generate
from support.servers import free_port, launch_server, radixcluster_command

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def ray_head(num_cpus: int, token: str | None = None) -> Iterator[str]:
    """A Ray head of our own on 127.0.0.1, with token authentication when ``token`` is given
    (stopped by killing its process group, never by `ray stop`, which would stop every Ray
    instance on the host)."""
    port = free_port()
    ray = Path(sys.executable).parent / "ray"
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
    env = {**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [
        str(ray),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        f"--num-cpus={num_cpus}",
        "--num-gpus=0",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=false",
        f"--temp-dir={tempfile.mkdtemp(prefix='rh-')}",
    ]
    head = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8)  # the GCS comes up in a few seconds; `radixcluster up` retries the connection
        assert head.poll() is None, "the Ray head did not start"
        yield f"127.0.0.1:{port}"
        assert head.poll() is None, "stopping radixcluster stopped a Ray head it did not start"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


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
