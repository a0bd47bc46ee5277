"""Processes tied to their parent, and a command split so that a signal to its caller's process
group reaches it alone: real processes, real signals."""

from __future__ import annotations

import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing import resource_tracker
from pathlib import Path

from radixcluster.process_tree import (
    MAX_SOCKET_PATH,
    OPEN_FILES,
    descendants,
    is_running,
    runtime_root,
    started_processes,
)

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


def run_script(script: str, shell_redirects: str = "", **popen) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter under bash, with ``shell_redirects`` (``<&-``)."""
    return subprocess.run(
        ["bash", "-c", f'exec "{sys.executable}" -c "$0" {shell_redirects}', script],
        capture_output=True,
        text=True,
        timeout=60,
        **popen,
    )


def test_closed_standard_streams_are_reopened_on_dev_null_before_anything_opens_files():
    """`radixcluster up <&-` died at once: the reaper's lifeline pipe took fd 0, which the reaper
    then pointed at /dev/null; with stdout closed, print raised on a None sys.stdout."""
    script = (
        "import os, sys\n"
        "from radixcluster.process_tree import open_standard_streams\n"
        "open_standard_streams()\n"
        "print('said', flush=True)\n"  # to /dev/null where stdout was closed
        "assert sys.stdin.read() == ''\n"
        "os.write(3, str(min(os.pipe())).encode())\n"
    )
    for closed in ("<&-", ">&-", "2>&-", "<&- >&- 2>&-"):
        result = run_script(script, f"3>&1 {closed}")
        assert (result.returncode, result.stdout.split("\n")[-1]) == (0, "4"), (closed, result)


def test_a_tmpdir_too_long_for_the_sockets_under_it_gives_way_to_tmp(tmp_path, monkeypatch):
    """Ray's sockets under a runtime dir in a long TMPDIR (HPC schedulers set such) passed the
    107 bytes a Unix socket's path holds: ray.init failed with a traceback."""
    monkeypatch.setattr(tempfile, "tempdir", "/scratch/u1")
    assert runtime_root() == "/scratch/u1"  # short enough for the sockets under it: kept
    long = tmp_path / ("d" * (MAX_SOCKET_PATH - len(str(tmp_path))))
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    assert runtime_root() == "/tmp"


def test_the_open_file_limit_is_raised_to_the_hard_one():
    """A server's every connection holds a file: at a soft limit of 256 a few hundred clients
    lost requests."""
    script = (
        "import resource\n"
        "from radixcluster.process_tree import raise_open_file_limit\n"
        "print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    low = min(256, hard)
    result = run_script(script, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    assert result.stdout.split() == [str(target), str(target), str(hard)], result
