"""What /proc/cpuinfo says about this CPU (its model, vendor and flags): what the linear layers
choose by, and what a benchmark records; and what /proc says of a process (its state, its CPU time)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@cache
def cpuinfo_text(path: Path = CPUINFO) -> str:
    """The file's text; empty where there is none (not Linux)."""
    try:
        return path.read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first CPU's flags (``avx2``, ``amx_tile``, ...)."""
    return set(cpuinfo_field("flags", cpuinfo).split())


def cpuinfo_field(name: str, cpuinfo: str) -> str:
    """The first CPU's ``name`` field of ``cpuinfo``, or an empty string."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def proc_stat_fields(pid: int | str) -> list[str]:
    """``/proc/PID/stat`` after the command name (state first); OSError where there is none."""
    # the command name may hold spaces and parentheses: fields start after the last ")"
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process ``pid`` has used; 0.0 where /proc cannot say."""
    try:
        fields = proc_stat_fields(pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
