"""One replica of `radixcluster up --dp-size N`, run by a Ray actor pinned to a node: the actor
starts `radixcluster up` there as a child process (its own router, api and TP group on that
node, the router reaching rank 0 over ipc://), reports its URL, tells when it exits, stops it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO

import httpx

from radixcluster.server_args import ADMIN_API_KEY_ENV, API_KEY_ENV, free_port, http_url, local_get

STARTUP_TIMEOUT_S = 600
STOP_GRACE_S = 30
STDERR_TAIL_LINES = 20


class ReplicaStartError(RuntimeError):
    """A replica exited, or never became healthy, while starting; the message ends with the
    last line it wrote to stderr (its refusal of a flag, or its exception)."""


def _command() -> list[str]:
    script = Path(sys.executable).parent / "radixcluster"
    return [str(script)] if script.exists() else [sys.executable, "-m", "radixcluster"]


def _relay(stream: IO[bytes], tail: deque[str]) -> None:
    """Copy the replica's stderr to the actor's (Ray's log of it, as before), keeping its last
    lines for the error of a replica that fails to start."""
    for raw in stream:
        line = raw.decode(errors="replace")
        sys.stderr.write(line)
        sys.stderr.flush()
        tail.append(line)


class ReplicaProcess:
    """Ray wraps it as an actor with ``max_concurrency=2``, so ``stop`` runs while ``wait`` blocks."""

    def __init__(
        self, argv: list[str], ray_address: str, node_ip: str, host: str, api_key: str | None, admin_api_key: str | None
    ) -> None:
        """``node_ip``: the Ray node this actor runs on; ``host``: where the replica listens (its
        HTTP port and its tree events); the keys go to the replica in its environment."""
        self.port = free_port(host)
        self.url = http_url(host, self.port)
        self.argv = [
            *_command(),
            "up",
            *argv,
            "--host",
            host,
            "--port",
            str(self.port),
            "--ray-address",
            ray_address,
            "--node-ip-address",
            node_ip,
            "--kv-events-address",
            f"tcp://{host}:0",
        ]
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.process: subprocess.Popen | None = None

    def start(self) -> str:
        """Start the replica (again, on the same port) and return its URL once it is healthy."""
        env = dict(os.environ)
        # Ray hides the GPUs from an actor that asked for none; the replica's own TP actors
        # get theirs from Ray, and its launcher must see the node's devices to plan for them.
        if env.get("CUDA_VISIBLE_DEVICES") == "":
            del env["CUDA_VISIBLE_DEVICES"]
        # not on the command line, where ps shows it
        for name, key in ((API_KEY_ENV, self.api_key), (ADMIN_API_KEY_ENV, self.admin_api_key)):
            if key:
                env[name] = key
        self.process = subprocess.Popen(
            self.argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        relay = threading.Thread(target=_relay, args=(self.process.stderr, tail), daemon=True)
        relay.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                relay.join()
                last = next((line for line in reversed(tail) if line.strip()), "(nothing on stderr)")
                raise ReplicaStartError(
                    f"replica {self.url} exited with {self.process.returncode} while starting: {last.strip()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if local_get(f"{self.url}/health", self.headers).status_code == 200:
                    return self.url
            time.sleep(0.5)
        self.stop(STOP_GRACE_S)
        raise ReplicaStartError(f"replica {self.url} was not healthy within {STARTUP_TIMEOUT_S} s")

    def wait(self) -> int:
        """Block until the replica exits; its exit code."""
        assert self.process is not None, "start() first"
        return self.process.wait()

    def pid(self) -> int | None:
        """The replica's `radixcluster up` process (the leader of its process group)."""
        return self.process.pid if self.process is not None else None

    def stop(self, grace_s: float) -> None:
        """SIGTERM (the replica drains and stops its processes), SIGKILL after ``grace_s``."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
