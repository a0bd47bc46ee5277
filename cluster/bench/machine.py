"""What a benchmark records about the machine it ran on: the CPU model, its vector extensions,
and the load other work put on it."""

from __future__ import annotations

import os
from pathlib import Path

from radixcluster.cpu_info import CPUINFO, cpu_flags, cpuinfo_field, cpuinfo_text

# flags of /proc/cpuinfo that decide which CPU kernels run
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_model(cpuinfo_path: Path = CPUINFO) -> str:
    """``"AMD EPYC (family 26, model 2), 2 CPUs (avx2, ...)"``: the model name with its cpuid
    family and model (a guest's model name can hide the generation: "AMD EPYC" is Zen 4 at
    family 25, Zen 5 at 26), the CPUs this process may use and the vector extensions of
    VECTOR_FLAGS that the CPU has."""
    cpuinfo = cpuinfo_text(cpuinfo_path)
    if not cpuinfo:
        return "unknown CPU"
    flags = cpu_flags(cpuinfo)
    present = [flag for flag in VECTOR_FLAGS if flag in flags] or ["no AVX2"]
    family, model = cpuinfo_field("cpu family", cpuinfo), cpuinfo_field("model", cpuinfo)
    generation = f" (family {family}, model {model})" if family and model else ""
    name = cpuinfo_field("model name", cpuinfo) or "unknown CPU"
    return f"{name}{generation}, {len(os.sched_getaffinity(0))} CPUs ({', '.join(present)})"


def load_average(loadavg_path: Path = Path("/proc/loadavg")) -> str:
    """The 1-, 5- and 15-minute load averages, e.g. ``"0.52 0.61 0.70"``."""
    try:
        return " ".join(loadavg_path.read_text().split()[:3])
    except OSError:
        return "unknown"
