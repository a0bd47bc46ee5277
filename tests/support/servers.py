"""Real servers for end-to-end tests: `radixcluster up` on 127.0.0.1 with the embedded model.

Imported by test modules (``from servers import launch_server``): pytest puts tests/ on the path."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from radixcluster.server_args import free_port

STARTUP_TIMEOUT_S = 300


@dataclass(slots=True)
class ServerHandle:
    url: str
    api_key: str | None
    process: subprocess.Popen

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def radixcluster_command() -> list[str]:
    script = Path(sys.executable).parent / "radixcluster"
    return [str(script)] if script.exists() else [sys.executable, "-m", "radixcluster"]


def wait_healthy(handle: ServerHandle, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.process.poll() is not None:
            raise RuntimeError(f"radixcluster up exited with {handle.process.returncode} before it was healthy")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{handle.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"server at {handle.url} not healthy within {timeout}s")


def stop_server(handle: ServerHandle, timeout: float = 60) -> None:
    """SIGTERM, as a person's Ctrl-C or Kubernetes would; kill the group if it overstays."""
    if handle.process.poll() is None:
        handle.process.send_signal(signal.SIGTERM)
        try:
            handle.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(handle.process.pid, signal.SIGKILL)
            handle.process.wait()


@contextlib.contextmanager
def launch_server(
    *extra_args: str,
    api_key: str | None = None,
    key_in_env: bool = False,
    env: dict[str, str] | None = None,
    command: str = "up",
) -> Iterator[ServerHandle]:
    """Start `radixcluster up` (or ``command``, e.g. "gateway") with extra flags (the API key as a
    flag, or in the environment with ``key_in_env``; ``env`` added to the environment); yield once
    /health answers; stop it after."""
    port = free_port()
    cmd = [*radixcluster_command(), command, "--host", "127.0.0.1", "--port", str(port), *extra_args]
    environment = {**os.environ, **(env or {})}
    if api_key and key_in_env:
        environment["RADIXCLUSTER_API_KEY"] = api_key
    elif api_key:
        cmd += ["--api-key", api_key]
    process = subprocess.Popen(cmd, start_new_session=True, env=environment)
    handle = ServerHandle(url=f"http://127.0.0.1:{port}", api_key=api_key, process=process)
    try:
        wait_healthy(handle)
        yield handle
    finally:
        stop_server(handle)


@contextlib.contextmanager
def command_process(*args: str, **popen: Any) -> Iterator[subprocess.Popen]:
    """`radixcluster ARGS` in a session of its own (``popen``: its pipes), killed with its whole
    group if it still runs when the block ends."""
    process = subprocess.Popen([*radixcluster_command(), *args], start_new_session=True, text=True, **popen)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_replicas(handle: ServerHandle, count: int, timeout: float = STARTUP_TIMEOUT_S) -> list[dict]:
    """Until a gateway sees ``count`` replicas available with their cache views in step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            listed = requests.get(f"{handle.url}/replicas", headers=handle.headers(), timeout=5).json()["replicas"]
            if sum(r["available"] and r["synced"] for r in listed) == count:
                return listed
        time.sleep(0.5)
    raise TimeoutError(f"the gateway at {handle.url} did not see {count} replicas in step within {timeout}s")
