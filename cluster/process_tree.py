"""The processes a command started, read from /proc (Linux), so that shutdown can prove none is
left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _stat_fields(pid: int | str) -> list[str]:
    # the command name may hold spaces and parentheses: fields start after the last ")"
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> set[int]:
    """Every process whose parent chain reaches ``pid`` (empty where /proc does not exist)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(entry.name)] = int(_stat_fields(entry.name)[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def is_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return _stat_fields(pid)[0] != "Z"
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
