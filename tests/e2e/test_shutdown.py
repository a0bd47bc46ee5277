"""Stopping a real `radixcluster up`: SIGTERM to the command alone (Kubernetes, Docker) or to its
whole process group (Ctrl-C) drains it, running requests finish, those that cannot end with an
error event, and no process is left; a SIGKILLed command takes its processes with it. Also what
such a server exposes: nothing listens beyond loopback (Ray, the TP rendezvous, gloo), and an API
key given in the environment never shows in a command line."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from radixcluster.process_tree import descendants
from support.api_helpers import TIMEOUT_S, assert_error
from support.listening import listeners
from support.servers import launch_server
from support.streams import started_streams, wait_gone

pytestmark = pytest.mark.slow

KEY = "key-from-the-environment"


def finished_normally(events: list) -> bool:
    return events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_sigterm_to_the_command_drains_then_exits_with_nothing_left():
    # the timeout leaves short requests time to finish on a busy machine; the endless one waits it out
    with launch_server("--shutdown-timeout", "60", api_key=KEY, key_in_env=True) as srv:
        tree = descendants(srv.process.pid)
        for pid in tree | {srv.process.pid}:
            assert KEY not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert_error(requests.get(srv.url + "/v1/models", timeout=TIMEOUT_S), 401)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            endless = started_streams(srv, pool, [4000])
            short = started_streams(srv, pool, [4, 4, 4])
            srv.process.send_signal(signal.SIGTERM)
            # readiness and new requests see the drain at once; running requests go on
            while requests.get(srv.url + "/health", timeout=TIMEOUT_S).status_code == 200:
                time.sleep(0.05)
            assert_error(requests.get(srv.url + "/health", timeout=TIMEOUT_S), 503, "shutting down")
            refused = requests.post(
                srv.url + "/generate", json={"text": "late"}, headers=srv.headers(), timeout=TIMEOUT_S
            )
            assert_error(refused, 503, "shutting down")
            assert all(finished_normally(f.result()) for f in short)
            # the endless one runs to --shutdown-timeout, then ends with an explicit error
            last = endless[0].result()
            assert last[-1] == "[DONE]" and last[-2]["error"]["code"] == 503
        assert srv.process.wait(timeout=120) == 0
        assert wait_gone(tree, 10) == set()


def test_tp3_listens_on_loopback_only_and_drains_on_sigterm_to_its_process_group():
    with launch_server("--tp-size", "3", "--shutdown-timeout", "120") as srv:
        tree = descendants(srv.process.pid)
        open_ports = listeners(tree)
        commands = {x.command for x in open_ports}
        assert {"gcs_server", "raylet"} <= commands, commands  # Ray's services are among them
        assert len([x for x in open_ports if x.command.startswith("ray::TPWorker")]) >= 3  # gloo / the store
        assert [x for x in open_ports if not x.loopback_only] == []
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            running = started_streams(srv, pool, [4, 4, 4, 4])
            os.killpg(srv.process.pid, signal.SIGTERM)  # as Ctrl-C would: everyone in the group
            assert all(finished_normally(f.result()) for f in running)
        assert srv.process.wait(timeout=120) == 0
        assert wait_gone(tree, 10) == set()


def test_a_sigkilled_command_takes_its_processes_with_it():
    with launch_server() as srv:
        tree = descendants(srv.process.pid)
        assert len(tree) >= 4  # the launcher, the router, the api, Ray
        srv.process.kill()
        srv.process.wait()
        assert wait_gone(tree, 10) == set()
        with pytest.raises(requests.ConnectionError):
            requests.get(srv.url + "/health", timeout=5)
