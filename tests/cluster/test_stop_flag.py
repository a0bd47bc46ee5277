"""The launchers' stop request: set from a real signal handler while the main thread waits on
it, it ends the wait; unset, the wait times out; it remembers when it was first set."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from radixcluster.stop_flag import StopFlag


@pytest.fixture
def flag_on_sigusr1() -> Iterator[StopFlag]:
    flag = StopFlag()
    saved = signal.signal(signal.SIGUSR1, lambda *_: flag.set())
    yield flag
    signal.signal(signal.SIGUSR1, saved)


def test_a_signal_during_the_wait_ends_it(flag_on_sigusr1: StopFlag) -> None:
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        assert flag_on_sigusr1.wait(60)  # False would mean the wait ran out instead
    finally:
        timer.cancel()
    assert flag_on_sigusr1.is_set()


def test_unset_the_wait_times_out() -> None:
    flag = StopFlag()
    start = time.monotonic()
    assert not flag.wait(0.2)
    assert time.monotonic() - start >= 0.2
    assert not flag.is_set() and flag.seconds_set() == 0.0


def test_it_remembers_when_it_was_first_set() -> None:
    flag = StopFlag()
    flag.set()
    time.sleep(0.1)
    flag.set()
    assert flag.seconds_set() >= 0.1
    assert flag.wait(0)
