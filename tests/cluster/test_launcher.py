"""When a signal stops `radixcluster up`: the handler only records the stop (an exception raised
from it inside Ray's blocking calls comes out as a SystemError, or not at all), the start-up gives
up at its next check while nothing can hold a request, and once the api (or the gateway) process
exists the stop drains; a second signal ends the api's drain, unless it is the first one delivered
twice; a signal that lands while the handler of another runs is handled too. Real signals to this
process, a real api stand-in process. (A SIGTERM while Ray loads the ranks:
tests/e2e/test_cluster.py.)"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from radixcluster.data_parallel import DataParallelLauncher
from radixcluster.launcher import SAME_SIGNAL_S, Launcher
from radixcluster.ray_cluster import StopRequested, check_stop
from radixcluster.server_args import ServerArgs


@pytest.fixture
def own_handlers() -> Iterator[None]:
    """The launchers install handlers for SIGTERM and SIGINT: pytest's come back after."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_while_loading_is_a_stop_the_start_up_finds_at_its_next_check(own_handlers: None) -> None:
    launcher = Launcher(ServerArgs())
    launcher._handle_signals()
    check_stop(launcher.stopping)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)  # neither raises where it lands
    assert launcher.stopping.is_set()
    with pytest.raises(StopRequested):
        check_stop(launcher.stopping)


def test_once_the_api_exists_a_signal_drains_and_a_second_ends_the_drain(own_handlers: None) -> None:
    launcher = Launcher(ServerArgs())
    launcher._handle_signals()
    launcher.api = api = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    api.start()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # as when /health answered before the launcher saw it
        os.kill(os.getpid(), signal.SIGTERM)  # the same stop again, as the command relays it
        assert launcher.stopping.is_set() and api.is_alive()
        time.sleep(SAME_SIGNAL_S)
        os.kill(os.getpid(), signal.SIGTERM)
        api.join(30)
        # the second signal reached the api as SIGINT (a KeyboardInterrupt once Python is up)
        assert api.exitcode in (1, -signal.SIGINT)
    finally:
        api.kill()
        api.join()


def test_the_data_parallel_command_only_records_the_stop(own_handlers: None) -> None:
    launcher = DataParallelLauncher(ServerArgs())
    try:
        launcher._handle_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert launcher.stopping.is_set()
    finally:
        shutil.rmtree(launcher.runtime_dir)  # its run would remove it; this test never runs it


# A second SIGTERM sent from inside the first one's handling, at its k-th traced line, for every
# k: `pkill -f radixcluster` signals the command's child directly and through the command's relay,
# so the two can overlap. A handler that took a lock (threading.Event.set) deadlocked at the line
# holding it, and the command then ignored every SIGTERM. A subprocess, so a hang fails the test.
NESTED = """
import os, signal, sys
from radixcluster.launcher import Launcher
from radixcluster.server_args import ServerArgs

def nest_at(k):
    launcher = Launcher(ServerArgs())
    launcher._handle_signals()
    handler = signal.getsignal(signal.SIGTERM)
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
            if lines == k:
                os.kill(os.getpid(), signal.SIGTERM)
        return tracer

    def traced(signum, frame):
        sys.settrace(tracer)
        try:
            handler(signum, frame)
        finally:
            sys.settrace(None)

    signal.signal(signal.SIGTERM, traced)
    os.kill(os.getpid(), signal.SIGTERM)
    assert launcher.stopping.is_set()
    return lines >= k

k = 1
while nest_at(k):
    k += 1
print(k - 1)
"""


def test_a_signal_landing_inside_another_ones_handler_is_handled() -> None:
    done = subprocess.run([sys.executable, "-c", NESTED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 2  # lines of the handling it nested into, each in turn
