"""A real `radixcluster up` on a host unlike a laptop (probe AE): proxy variables that point at a
proxy that never answers, a stale RAY_ADDRESS, a TMPDIR too long for the sockets under it, stdin
closed, a low open-file limit and `--host ::`, all at once. Each of them alone kept the command
from saying it was ready (the launcher's own checks went to the proxy, or to 127.0.0.1 for ::),
or ended it with a traceback."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
import requests

from radixcluster.process_tree import MAX_SOCKET_PATH, OPEN_FILES, descendants
from support.servers import command_process, free_port
from support.streams import wait_gone

pytestmark = pytest.mark.slow


def _ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


def _closed_stdin_and_few_open_files() -> None:
    os.close(0)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))


def test_up_serves_and_stops_cleanly_on_a_host_set_up_against_it(tmp_path: Path):
    host, loopback = ("::", "[::1]") if _ipv6_loopback() else ("0.0.0.0", "127.0.0.1")
    port = free_port()
    long_tmpdir = tmp_path / ("t" * (MAX_SOCKET_PATH - len(str(tmp_path)) - 1))
    long_tmpdir.mkdir()
    with socket.create_server(("127.0.0.1", 0)) as tarpit:  # takes connections, answers none
        proxy = f"http://127.0.0.1:{tarpit.getsockname()[1]}"
        env = {
            **os.environ,
            **dict.fromkeys(("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"), proxy),
            "ALL_PROXY": "socks5://127.0.0.1:1",
            "RAY_ADDRESS": "127.0.0.1:1",
            "TMPDIR": str(long_tmpdir),
        }
        argv = ("up", "--host", host, "--port", str(port))
        with command_process(
            *argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_closed_stdin_and_few_open_files,
        ) as process:
            ready = process.stdout.readline().strip()
            assert ready.endswith(f":{port}") and ready.startswith("radixcluster ready: http://"), ready
            assert requests.get(f"http://{loopback}:{port}/health", timeout=10, proxies={}).status_code == 200
            limits = Path(f"/proc/{process.pid}/limits").read_text()
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            soft = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
            assert any(line.startswith("Max open files") and f" {soft} " in line for line in limits.splitlines())
            tree = descendants(process.pid)
            process.send_signal(signal.SIGTERM)
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, err
    assert "RAY_ADDRESS=127.0.0.1:1 is ignored" in err and "Traceback" not in err
    assert wait_gone(tree, 10) == set()
    # its runtime dir went under /tmp, and went with it
    assert list(long_tmpdir.iterdir()) == []
    assert list(Path(tempfile.gettempdir()).glob(f"radixcluster-{process.pid}-*")) == []
