"""What /proc/cpuinfo says about this CPU (its model, vendor and flags): what the linear layers
choose by, and what a benchmark records."""

from __future__ import annotations

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
