"""What a benchmark records of its machine, read from cpuinfo files written as the kernel writes
them: the model name with its cpuid family and model, the usable CPUs and the vector extensions."""

from __future__ import annotations

import os
from pathlib import Path

from radixcluster.bench.machine import cpu_model, load_average

ZEN5_GUEST = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vp2intersect

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vp2intersect
"""


def test_the_model_name_carries_the_cpuid_family_and_model(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(ZEN5_GUEST)
    cpus = len(os.sched_getaffinity(0))
    assert cpu_model(cpuinfo) == f"AMD EPYC (family 26, model 2), {cpus} CPUs (avx2, avx512f, avx512_bf16)"


def test_a_cpuinfo_without_family_or_flags_says_so(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2\n")
    assert cpu_model(cpuinfo).endswith("CPUs (no AVX2)") and cpu_model(cpuinfo).startswith("Some CPU, ")
    assert cpu_model(tmp_path / "missing") == "unknown CPU"


def test_the_load_average_is_its_three_numbers(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.61 0.70 2/345 6789\n")
    assert load_average(loadavg) == "0.52 0.61 0.70"
    assert load_average(tmp_path / "missing") == "unknown"
