"""The step watchdog on a real `radixcluster up`: a rank that stops answering (SIGSTOP, as a stuck
collective would) ends the requests in flight with an error naming the timeout, and the replica
exits 1 with nothing left behind, instead of waiting on the rank forever."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from pathlib import Path

import pytest

from radixcluster.process_tree import descendants
from support.servers import launch_server
from support.streams import started_streams, wait_gone

pytestmark = pytest.mark.slow


def tp_worker_pids(pids: set[int]) -> list[int]:
    def command(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    return [pid for pid in pids if command(pid).startswith("ray::TPWorker")]


def test_a_stopped_rank_ends_its_requests_and_the_replica_with_the_reason():
    # far above a step of this model on a busy CPU, yet short enough for a test
    with launch_server("--step-timeout", "20") as srv:
        tree = descendants(srv.process.pid)
        (rank,) = tp_worker_pids(tree)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            (endless,) = started_streams(srv, pool, [4000])
            os.kill(rank, signal.SIGSTOP)
            events = endless.result()
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["code"] == 503 and "--step-timeout 20" in events[-2]["error"]["message"]
        assert srv.process.wait(timeout=120) == 1
        assert wait_gone(tree, 10) == set()
