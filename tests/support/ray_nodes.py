"""Ray nodes of our own for end-to-end tests: a head and more nodes on loopback addresses of
this host (each stopped by killing its process group, never by `ray stop`, which would stop
every Ray instance on the host). Ray takes 127.0.0.1 for "this host" and replaces it with the
host's network address; 127.0.0.2, 127.0.0.3, ... stay loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from support.servers import free_port

START_TIMEOUT_S = 180
STOP_GRACE_S = 3
STARTED = "Ray runtime started"


@contextlib.contextmanager
def _ray_start(*flags: str, token: str | None = None) -> Iterator[subprocess.Popen]:
    """`ray start --block` with ``flags`` (and token authentication when ``token`` is given),
    once it says it started; stopped after."""
    ray = Path(sys.executable).parent / "ray"
    temp = Path(tempfile.mkdtemp(prefix="rn-"))
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
    env = {**os.environ, **auth, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [str(ray), "start", "--block", "--num-gpus=0", f"--temp-dir={temp}", *flags]
    log = temp / "ray-start.log"
    with log.open("w") as out:
        process = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while STARTED not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, (
                f"ray start failed: {log.read_text()[-2000:]}"
            )
            time.sleep(0.5)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        # a short grace, then the group's SIGKILL takes every Ray process of the node: after a
        # SIGTERM, `ray start --block` and its GCS server linger ~30 s, which a test has no use for
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def ray_head(num_cpus: int, node_ip: str = "127.0.0.1", token: str | None = None) -> Iterator[str]:
    """A Ray head (token-authenticated when ``token`` is given); yields its address. It must still
    run when the block ends: stopping a radixcluster that joined it must leave it running."""
    port = free_port()
    flags = (f"--port={port}", f"--num-cpus={num_cpus}", f"--node-ip-address={node_ip}", "--include-dashboard=false")
    with _ray_start("--head", *flags, token=token) as head:
        yield f"{node_ip}:{port}"
        assert head.poll() is None, "stopping radixcluster stopped a Ray head it did not start"


@contextlib.contextmanager
def ray_node(address: str, node_ip: str, num_cpus: int) -> Iterator[None]:
    """One more node of the cluster at ``address``, as ``node_ip`` (another loopback address)."""
    with _ray_start(f"--address={address}", f"--node-ip-address={node_ip}", f"--num-cpus={num_cpus}"):
        yield
