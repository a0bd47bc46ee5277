"""The gateway's server as `radixcluster gateway` runs it: a real process on a real port."""

from __future__ import annotations

import select
import signal
import subprocess

import requests

from support.servers import command_process, free_port


def test_the_command_says_it_is_ready_once_it_listens_and_stops_on_sigterm() -> None:
    """At the default log level it printed nothing at all: neither a person nor a script could
    tell when it served."""
    port = free_port()
    argv = ("gateway", "--host", "127.0.0.1", "--port", str(port), f"--replica=http://127.0.0.1:{free_port()}")
    with command_process(*argv, stdout=subprocess.PIPE) as process:
        assert select.select([process.stdout], [], [], 120)[0], "no line within 120 s"
        line = process.stdout.readline()
        # it listens when it says so; unhealthy while its one replica does not answer
        assert requests.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 503
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert line == f"radixcluster gateway ready: http://127.0.0.1:{port}, routing over 1 replica(s)\n"
