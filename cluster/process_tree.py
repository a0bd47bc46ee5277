"""The processes a command started: read from /proc (Linux), so that shutdown can prove none is
left behind; tied to their parent, so that none outlives it; and kept out of the caller's process
group, so that a signal to that group reaches the command alone, which then stops the rest in order.
Also the command's runtime directories (sockets, Ray's session), removed however it ends."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from radixcluster.cpu_info import proc_stat_fields

_PR_SET_PDEATHSIG = 1
# the pid of the command (fork_into_own_group's caller), which names its processes' runtime dirs
_COMMAND_PID = "RADIXCLUSTER_COMMAND_PID"
# the runtime dirs' kinds (a replica's, a --dp-size command's), which name them and find them again
RUNTIME_KINDS = ("", "dp-")
# a Unix socket's path holds at most 107 bytes. Under a runtime dir, Ray's longest is its
# session's /session_<date>_<time>_<usec>_<pid>/sockets/plasma_store (57 and a pid); the runtime
# dir's own name is /radixcluster-dp-<pid>-<8 letters> (26 and a pid)
MAX_SOCKET_PATH = 107
RAY_SOCKET_TAIL = 57
RUNTIME_NAME_LEN = 26
# open files a server asks for (each client connection holds one)
OPEN_FILES = 65536


def descendants(pid: int) -> set[int]:
    """Every process whose parent chain reaches ``pid`` (empty where /proc does not exist)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry.name)] = int(proc_stat_fields(entry.name)[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def started_processes() -> set[int]:
    """The processes this one started that must stop with it: its descendants, less
    multiprocessing's resource tracker, which ignores SIGTERM and ends when this process does
    (its pid is private; where it cannot be read, the tracker is counted and waited out)."""
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    return descendants(os.getpid()) - {tracker}


def is_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return proc_stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_survivors(pids: set[int], grace_s: float) -> None:
    """Give ``pids`` ``grace_s`` to exit by themselves, then SIGKILL the rest."""
    deadline = time.monotonic() + grace_s
    while (alive := {p for p in pids if is_running(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere a no-op), and
    exit now if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)


def runtime_dir(kind: str = "") -> str:
    """A new private directory (a replica's sockets and Ray's session; ``kind``, one of
    RUNTIME_KINDS, in its name), named after the command that started this process, which
    removes it however its processes end: SIGKILLed ones clean nothing up themselves (see
    fork_into_own_group)."""
    assert kind in RUNTIME_KINDS, f"{kind!r} is no runtime dir kind: remove_runtime_dirs would miss it"
    command = os.environ.get(_COMMAND_PID, str(os.getpid()))
    return tempfile.mkdtemp(prefix=f"radixcluster-{kind}{command}-", dir=runtime_root())


def runtime_root() -> str:
    """Where the runtime dirs go: the temporary directory (TMPDIR), or /tmp where that is too long
    a path for the sockets under it (HPC schedulers set long ones; Ray failed with a traceback)."""
    root = tempfile.gettempdir()
    longest = MAX_SOCKET_PATH - RUNTIME_NAME_LEN - RAY_SOCKET_TAIL - 2 * _pid_digits()
    if len(root) <= longest:
        return root
    if not os.access("/tmp", os.W_OK | os.X_OK):
        raise ValueError(
            f"TMPDIR={root} is too long for the sockets under it (a Unix socket's path holds at most "
            f"{MAX_SOCKET_PATH} bytes) and /tmp is not writable: set TMPDIR to a path of at most {longest} characters"
        )
    return "/tmp"


def _pid_digits() -> int:
    """The digits of the largest pid this host gives."""
    try:
        return len(Path("/proc/sys/kernel/pid_max").read_text().strip())
    except OSError:
        return 7  # Linux's largest pid_max, 4194304


def remove_runtime_dirs(command: int) -> None:
    """Remove the runtime directories of the command whose pid is ``command``."""
    for kind in RUNTIME_KINDS:
        for path in Path(runtime_root()).glob(f"radixcluster-{kind}{command}-*"):
            shutil.rmtree(path, ignore_errors=True)


def raise_open_file_limit() -> int:
    """Raise the soft limit of open files to the hard one (at most OPEN_FILES), as SGLang does at
    start: every connection and stream holds a file, and at 256 or 1,024 (common defaults) a few
    hundred clients ran the api out of them (lost requests, 500s from failed imports). Returns
    the limit now in force (OPEN_FILES where there is none)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return OPEN_FILES
    target = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def open_standard_streams() -> None:
    """Put /dev/null in place of a closed stdin, stdout or stderr (``<&-``): the next file opened
    would take its number (the reaper's lifeline pipe took 0, which the reaper then pointed at
    /dev/null, read the end of, and killed the command), and Python leaves ``sys.stdout`` None,
    on which a print raises."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115 (the process's own stream)


def run_child(parent_pid: int, target: Callable[..., None], *args: Any) -> None:
    """A child process's entry point: tied to ``parent_pid``, then ``target(*args)``."""
    die_with_parent(parent_pid)
    target(*args)


def fork_into_own_group() -> int | None:
    """Split the command in two. The child returns None and goes on as the leader of a process
    group of its own, dying with the parent. The parent stays in the caller's group, relays
    SIGTERM and SIGINT to the child, and returns the child's exit code once it ends, after
    killing whatever the child's group still holds.

    A signal to the caller's whole process group (Ctrl-C, ``kill -- -PGID``) then reaches the
    parent alone, and the child stops its processes in order, as with a signal to it alone;
    without this, Ray's processes in the group would die at once under running requests. If the
    parent is SIGKILLed, a reaper (a third process in the child's group, blocked on a pipe only
    the parent writes to) kills the whole group: some of Ray's agents outlive their raylet."""
    parent = os.getpid()
    os.environ[_COMMAND_PID] = str(parent)  # inherited by every process of the command
    lifeline, held = os.pipe()  # the parent holds ``held`` open until it dies
    relayed = {signal.SIGTERM, signal.SIGINT}
    # a signal that comes before the relay is set up waits for it, instead of killing the parent
    signal.pthread_sigmask(signal.SIG_BLOCK, relayed)
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, relayed)
        os.close(lifeline)
        os.close(held)
        os.setpgid(0, 0)
        die_with_parent(parent)
        return None
    os.setpgid(child, child)  # as the child does: whichever runs first, the group exists
    if os.fork() == 0:
        _reap_when_closed(lifeline, held, child, parent)  # ignores the relayed signals, blocked or not
    os.close(lifeline)

    def relay(sig: int, _: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, sig)

    for sig in relayed:
        signal.signal(sig, relay)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, relayed)
    while True:
        # any child: as PID 1 of a container, orphans are ours to reap too
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)  # leftovers, and the reaper
            remove_runtime_dirs(parent)  # what a SIGKILLed child left
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def _reap_when_closed(lifeline: int, held: int, group: int, command: int) -> None:
    """The reaper: wait for the parent's end of the pipe to close, then kill ``group`` and remove
    the runtime dirs of the ``command`` (the parent's pid). It shares
    the command's line, so ``pkill -f`` signals it too: it ignores SIGTERM and SIGINT, else such
    a stop would leave a later SIGKILL of the parent nothing to reap the group."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.close(held)
    os.setpgid(0, group)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never keep the caller's terminal or pipes open
        os.dup2(devnull, fd)
    while os.read(lifeline, 1):
        pass
    os.setpgid(0, 0)  # out of the group it kills, to remove the dirs after
    os.killpg(group, signal.SIGKILL)
    remove_runtime_dirs(command)
    os._exit(0)
