"""Self-healing on a real `radixcluster up --tp-size 3`: a rank that raises inside a step, one
killed with SIGKILL mid-decode and one stopped with SIGSTOP (the step watchdog) each cost no
request: every stream ends with exactly the tokens of an undisturbed run, the group is replaced
and the server goes on. A rank that dies at every load ends, past the budget, in a clean exit."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from radixcluster.process_tree import descendants, is_running
from support.servers import ServerHandle, free_port, launch_server, radixcluster_command, wait_healthy
from support.streams import finished_normally, started_streams, wait_gone

pytestmark = pytest.mark.slow

STREAMS, TOKENS = 6, 24
RAISE_AT_STEP = 20  # rank 1's 20th step: mid-decode of the first streams (one prefill step, then decodes)


def rank_pids(server: ServerHandle) -> dict[int, int]:
    """The TP ranks' processes by rank (each names its rank in its environment)."""
    ranks = {}
    for pid in descendants(server.process.pid):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::TPWorker"):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((v for k, _, v in (e.partition(b"=") for e in environ) if k == b"RADIXCLUSTER_TP_RANK"), None)
        if rank is not None and is_running(pid):
            ranks[int(rank)] = pid
    return ranks


def streams(server: ServerHandle, disturb: Callable[[], None] | None = None) -> list[list[int]]:
    """STREAMS greedy streams of TOKENS tokens at once, ``disturb`` called once each has its first
    token; each stream's token ids, asserting it ended normally."""
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        running = started_streams(server, pool, [TOKENS] * STREAMS)
        if disturb is not None:
            disturb()
        results = [future.result() for future in running]
    ids = []
    for events in results:
        assert events[-1] == "[DONE]" and "error" not in events[-2], events[-2]
        ids.append(events[-2]["output_ids"])
        assert len(ids[-1]) == TOKENS
    return ids


def metric(server: ServerHandle, name: str) -> float:
    text = requests.get(server.url + "/metrics", headers=server.headers(), timeout=30).text
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_a_rank_that_fails_dies_or_hangs_costs_no_request():
    env = {"RADIXCLUSTER_FAULT": f"raise:1:{RAISE_AT_STEP}"}
    # the watchdog: far above one step of this model on a busy CPU, short enough for a test
    with launch_server("--tp-size", "3", "--step-timeout", "12", env=env) as srv:
        first = rank_pids(srv)
        assert sorted(first) == [0, 1, 2]
        raised = streams(srv)  # rank 1 raises in the middle of these
        assert metric(srv, "radixcluster_worker_restarts_total") == 1
        assert wait_gone(set(first.values()), 10) == set()  # the failed group is gone, all of it

        second = rank_pids(srv)
        killed = streams(srv, lambda: os.kill(second[0], signal.SIGKILL))  # rank 0: the router's peer
        assert metric(srv, "radixcluster_worker_restarts_total") == 2

        third = rank_pids(srv)
        stopped = streams(srv, lambda: os.kill(third[2], signal.SIGSTOP))
        assert metric(srv, "radixcluster_worker_restarts_total") == 3
        assert wait_gone({*second.values(), *third.values()}, 10) == set()

        undisturbed = streams(srv)
        assert raised == undisturbed and killed == undisturbed and stopped == undisturbed
        assert metric(srv, "radixcluster_requeued_requests_total") >= STREAMS
        assert metric(srv, "radixcluster_workers_up") == 1
        assert requests.get(srv.url + "/health", timeout=10).status_code == 200
        tree = descendants(srv.process.pid)
    assert srv.process.returncode == 0
    assert wait_gone(tree, 10) == set()


def test_a_rank_that_dies_at_every_load_ends_the_replica_with_the_reason(tmp_path):
    """A crash loop: rank 0 fails its second step, and every group after the first dies while
    loading. After --max-worker-restarts 2 replacements the request ends with the reason, and
    the replica exits 1 saying why, leaving nothing behind."""
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, "RADIXCLUSTER_FAULT": "raise:0:2,die_on_load:0:1"}
    command = [*radixcluster_command(), "up", "--host", "127.0.0.1", "--port", str(port), "--max-worker-restarts", "2"]
    with log.open("w") as out:
        process = subprocess.Popen(command, start_new_session=True, env=env, stderr=out, stdout=out)
    srv = ServerHandle(url=f"http://127.0.0.1:{port}", api_key=None, process=process)
    try:
        wait_healthy(srv)
        tree = descendants(process.pid)
        body = {"text": "Crash loop:", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        resp = requests.post(srv.url + "/generate", json=body, timeout=300)
        assert resp.status_code == 503
        assert "failed 3 times in a row" in resp.json()["error"]["message"]
        assert process.wait(timeout=120) == 1
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert wait_gone(tree, 10) == set()
    text = log.read_text()
    assert "giving up (--max-worker-restarts 2)" in text and "did not start" in text


def test_a_rank_lost_while_the_replica_drains_is_replaced_and_the_requests_in_flight_finish():
    """SIGTERM, then rank 0 killed during the drain: the group is replaced as at any other time
    (the requests waited out the whole drain for a 503), and the command exits 0."""
    with launch_server() as srv:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            running = started_streams(srv, pool, [160] * 4)
            srv.process.send_signal(signal.SIGTERM)
            time.sleep(1.0)
            os.kill(rank_pids(srv)[0], signal.SIGKILL)
            assert all(finished_normally(future.result()) for future in running)
        assert srv.process.wait(timeout=120) == 0
