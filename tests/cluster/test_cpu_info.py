"""/proc/cpuinfo read as the linear layers and the memory plan read it: the first CPU's fields,
its flags agreeing with what torch detects, and nothing (not an error) where there is no file."""

from __future__ import annotations

from pathlib import Path

import torch

from radixcluster.cpu_info import cpu_flags, cpuinfo_field, cpuinfo_text

TWO_CPUS = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: GenuineIntel
flags\t\t: fpu
"""


def test_the_first_cpus_fields_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(TWO_CPUS)
    text = cpuinfo_text(path)
    assert cpuinfo_field("vendor_id", text) == "AuthenticAMD"
    assert cpuinfo_field("model name", text) == "AMD EPYC 9R14"
    assert cpuinfo_field("microcode", text) == ""
    assert cpu_flags(text) == {"fpu", "avx2", "avx512f"}


def test_no_file_reads_as_empty(tmp_path: Path) -> None:
    assert cpuinfo_text(tmp_path / "missing") == ""
    assert cpu_flags("") == set()


def test_this_machines_flags_agree_with_torch() -> None:
    flags = cpu_flags(cpuinfo_text())
    assert ("amx_tile" in flags) == torch.cpu._is_amx_tile_supported()
    assert ("avx512f" in flags) >= torch.cpu._is_avx512_supported()
