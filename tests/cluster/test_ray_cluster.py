"""start_ray: a SIGTERM at any moment of Ray's start-up reaches the launcher's own handler (which
only records the stop), never one of Ray's, which raised SystemExit wherever the main thread was
(and in a fork hook the stop was lost) or aborted the process. A real private Ray instance, in a
subprocess so that the test process keeps its own handlers and no Ray state."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from radixcluster import ray_cluster

START_UNDER_SIGNALS = """
import os, signal, tempfile, threading, time
from radixcluster import ray_cluster

received = []
signal.signal(signal.SIGTERM, lambda *_: received.append(time.monotonic()))
starting = True

def signal_while_starting():
    while starting:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)

sender = threading.Thread(target=signal_while_starting)
sender.start()
ray_cluster.start_ray(None, tempfile.mkdtemp(), 1)
starting = False
sender.join()
during = len(received)
os.kill(os.getpid(), signal.SIGTERM)  # after ray.init: the handler at the C level is still ours
time.sleep(0.2)
import ray
ray.shutdown()
print(during, len(received) - during, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER" in os.environ)
"""


def test_signals_during_and_after_rays_start_reach_the_callers_handler() -> None:
    done = subprocess.run([sys.executable, "-c", START_UNDER_SIGNALS], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    during, after, flag_left = done.stdout.split()
    assert int(during) >= 10  # Ray's start takes seconds: dozens of signals, every one recorded
    assert int(after) == 1
    assert flag_left == "False"  # Ray's own processes keep their failure handler


WAIT_PAST_A_TIMEOUT = """
import tempfile, time
from radixcluster import ray_cluster
from radixcluster.stop_flag import StopFlag

ray_cluster.start_ray(None, tempfile.mkdtemp(), 1)
import ray
never = ray.remote(lambda: time.sleep(600)).remote()
began = time.monotonic()
try:
    ray_cluster.get_or_stop([never], StopFlag(), timeout_s=1.0)
except TimeoutError as exc:
    print(round(time.monotonic() - began), exc)
ray.shutdown()
"""


def test_a_wait_on_ray_with_a_timeout_ends_when_it_runs_out() -> None:
    """A group's ranks that never start (Ray's raylet killed) held the replica for ever."""
    done = subprocess.run([sys.executable, "-c", WAIT_PAST_A_TIMEOUT], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    waited, message = done.stdout.strip().split(" ", 1)
    assert int(waited) <= 3 and message == "1 of 1 Ray calls got no answer within 1 s"


def test_a_ray_address_nothing_listens_on_is_refused_at_once() -> None:
    """ray.init would retry it for ever, deaf to SIGTERM."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        ray_cluster.check_reachable(f"127.0.0.1:{port}")  # something answers: left to Ray
    with pytest.raises(ray_cluster.RayPlacementError, match=f"--ray-address 127.0.0.1:{port}: no Ray cluster"):
        ray_cluster.check_reachable(f"127.0.0.1:{port}")
    ray_cluster.check_reachable("auto")


def test_a_ranks_load_error_is_said_in_one_line_of_its_own() -> None:
    import ray.exceptions

    failed = ray.exceptions.RayTaskError(
        "TPWorker.load", "Traceback (most recent call last):\n  ...", ValueError("bad shard\nmore")
    )
    assert ray_cluster.first_line(failed) == "ValueError: bad shard"
    assert ray_cluster.first_line(RuntimeError("plain\nrest")) == "plain"
