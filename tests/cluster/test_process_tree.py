"""Processes tied to their parent, and a command split so that a signal to its caller's process
group reaches it alone: real processes, real signals."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from multiprocessing import resource_tracker
from pathlib import Path

from radixcluster.process_tree import descendants, is_running, started_processes

# A script whose forked child ties itself to the script, reports its pid and waits.
TIED_CHILD = """
import os, time
from radixcluster.process_tree import die_with_parent
if os.fork() == 0:
    die_with_parent(os.getppid())
    print(os.getpid(), flush=True)
time.sleep(600)
"""

# The split: the child starts a process of its own that is not tied to it (as Ray's agents are
# not) and makes a runtime dir, writes both pids, its process group and the dir, waits for
# SIGTERM, and exits 7.
SPLIT = """
import os, signal, subprocess, sys, time
from radixcluster.process_tree import fork_into_own_group, runtime_dir
code = fork_into_own_group()
if code is not None:
    sys.exit(code)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
untied = subprocess.Popen(["sleep", "600"])
print(os.getpid(), os.getpgid(0), untied.pid, runtime_dir(), flush=True)
time.sleep(600)
"""


def split_line(front: subprocess.Popen[str]) -> tuple[int, int, int, Path]:
    child, group, untied, directory = front.stdout.readline().split()
    return int(child), int(group), int(untied), Path(directory)


def wait_gone(pid: int, deadline_s: float = 30) -> bool:
    end = time.monotonic() + deadline_s
    while is_running(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not is_running(pid)


def test_a_tied_child_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", TIED_CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert is_running(child)
    parent.kill()
    parent.wait()
    assert wait_gone(child)


def test_a_signal_to_the_callers_group_reaches_the_split_command_once():
    front = subprocess.Popen([sys.executable, "-c", SPLIT], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, group, untied, _ = split_line(front)
    assert group == child != os.getpgid(front.pid)  # the child leads a group of its own
    os.killpg(front.pid, signal.SIGTERM)  # the caller's group: the front only, which relays it
    assert front.wait(timeout=60) == 7
    assert wait_gone(child) and wait_gone(untied)  # what the child left in its group goes too


def test_after_pkill_f_a_sigkilled_front_still_takes_the_whole_group_with_it():
    # pkill -f signals every process of the command line: the front, its child and the reaper
    # (forked from the front); a child still draining then outlives the signal
    draining = SPLIT.replace("lambda *_: sys.exit(7)", "signal.SIG_IGN")
    front = subprocess.Popen(
        [sys.executable, "-c", draining], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child, _, untied, _ = split_line(front)
    line = Path(f"/proc/{front.pid}/cmdline").read_bytes()
    same_line = [p for p in descendants(front.pid) | {front.pid} if Path(f"/proc/{p}/cmdline").read_bytes() == line]
    assert len(same_line) == 3  # the front, the child, the reaper
    for pid in same_line:
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)
    assert is_running(child)
    front.kill()
    front.wait()
    assert wait_gone(child) and wait_gone(untied)


def test_a_sigkilled_front_takes_the_whole_group_and_its_runtime_dirs_with_it():
    front = subprocess.Popen([sys.executable, "-c", SPLIT], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, _, untied, directory = split_line(front)
    assert directory.is_dir() and directory.name.startswith(f"radixcluster-{front.pid}-")
    front.kill()
    front.wait()
    assert wait_gone(child) and wait_gone(untied)
    deadline = time.monotonic() + 30  # the reaper removes it after the kill
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not directory.exists()


def test_a_sigkilled_child_leaves_its_runtime_dirs_to_the_front_which_removes_them():
    front = subprocess.Popen([sys.executable, "-c", SPLIT], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, _, untied, directory = split_line(front)
    os.kill(child, signal.SIGKILL)
    assert front.wait(timeout=60) == 128 + signal.SIGKILL
    assert wait_gone(untied) and not directory.exists()


def test_started_processes_leave_out_the_resource_tracker_which_ends_with_this_process():
    """A spawned child starts multiprocessing's resource tracker, which ignores SIGTERM: a
    shutdown that waited for it to exit would always wait out its whole grace."""
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=time.sleep, args=(600,), daemon=True)
    child.start()
    try:
        tracker = resource_tracker._resource_tracker._pid
        assert tracker is not None and is_running(tracker)
        assert child.pid in started_processes() and tracker in descendants(os.getpid())
        assert tracker not in started_processes()
    finally:
        child.kill()
        child.join()
