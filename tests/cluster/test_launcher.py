"""When a signal stops `radixcluster up`: while the replica loads, the first signal interrupts the
loading; once the api (or the gateway) process exists it may already hold requests, so the stop
drains them, and a later signal never unwinds the stop. Real signals to this process, a real api
stand-in process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator

import pytest

from radixcluster.data_parallel import DataParallelLauncher, _Stop
from radixcluster.launcher import Launcher, _StopDuringStartup
from radixcluster.server_args import ServerArgs


@pytest.fixture
def own_handlers() -> Iterator[None]:
    """The launchers install handlers for SIGTERM and SIGINT: pytest's come back after."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_interrupts_loading_until_the_api_exists(own_handlers: None) -> None:
    launcher = Launcher(ServerArgs())
    launcher._handle_signals()
    with pytest.raises(_StopDuringStartup):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    # the stop is under way: another signal must not unwind it
    os.kill(os.getpid(), signal.SIGINT)
    assert launcher.stopping.is_set()


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


def test_the_data_parallel_command_follows_the_same_rule(own_handlers: None) -> None:
    launcher = DataParallelLauncher(ServerArgs())
    launcher._handle_signals()
    with pytest.raises(_Stop):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
    launcher = DataParallelLauncher(ServerArgs())
    launcher._handle_signals()
    launcher.gateway = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    os.kill(os.getpid(), signal.SIGTERM)
    assert launcher.stopping.is_set()
