"""When a signal stops `radixcluster up`: the handler only records the stop (an exception raised
from it inside Ray's blocking calls comes out as a SystemError, or not at all), the start-up gives
up at its next check while nothing can hold a request, and once the api (or the gateway) process
exists the stop drains; a second signal ends the api's drain. Real signals to this process, a real
api stand-in process. (A SIGTERM while Ray loads the ranks: tests/e2e/test_cluster.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator

import pytest

from radixcluster.data_parallel import DataParallelLauncher
from radixcluster.launcher import Launcher
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
        assert launcher.stopping.is_set() and api.is_alive()
        os.kill(os.getpid(), signal.SIGTERM)
        api.join(30)
        # the second signal reached the api as SIGINT (a KeyboardInterrupt once Python is up)
        assert api.exitcode in (1, -signal.SIGINT)
    finally:
        api.kill()
        api.join()


def test_the_data_parallel_command_only_records_the_stop(own_handlers: None) -> None:
    launcher = DataParallelLauncher(ServerArgs())
    launcher._handle_signals()
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    assert launcher.stopping.is_set()
