"""A served replica's CPUs: the TP worker's OpenMP threads bound one per core of its rank's set,
computing at the normal priority (not Ray's nice 15), and no idle Ray worker processes beside it;
and its memory: no Ray memory monitor that would kill a rank for what other processes hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from radixcluster.process_tree import descendants
from radixcluster.replica_plan import machine_cpus
from support.api_helpers import generate

pytestmark = pytest.mark.slow


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _single_cpu_threads(pid: int) -> set[int]:
    """The CPUs of this process's threads that are bound to exactly one."""
    cpus = set()
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        allowed = next(line for line in status.read_text().splitlines() if line.startswith("Cpus_allowed_list"))
        value = allowed.split(":")[1].strip()
        if value.isdigit():
            cpus.add(int(value))
    return cpus


def test_the_worker_binds_one_thread_to_each_core_of_its_rank(server):
    expected = machine_cpus(1).rank_cpus
    if expected is None:
        pytest.skip("this machine's CPU quota leaves no cores to pin")
    generate(server, "Count to five:", max_new_tokens=4)  # the OpenMP pool starts with the first step
    workers = [pid for pid in descendants(server.process.pid) if _cmdline(pid).startswith("ray::TPWorker")]
    assert len(workers) == 1
    assert _single_cpu_threads(workers[0]) == set(expected[0])


def test_the_worker_computes_at_the_normal_priority(server):
    generate(server, "Count to five:", max_new_tokens=4)
    workers = [pid for pid in descendants(server.process.pid) if _cmdline(pid).startswith("ray::TPWorker")]
    assert workers
    for pid in workers:
        threads = [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
        assert {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads} == {0}


def test_ray_starts_no_idle_workers(server):
    idle = [pid for pid in descendants(server.process.pid) if _cmdline(pid).startswith("ray::IDLE")]
    assert idle == []


def test_ray_runs_no_memory_monitor(server):
    """Past 95 % of the host's memory Ray's monitor killed a rank, and each replacement, whoever
    held the memory; the raylet says in its log that it runs none."""
    (raylet,) = [pid for pid in descendants(server.process.pid) if _cmdline(pid).split(" ")[0].endswith("/raylet")]
    log_dir = next(a.split("=", 1)[1] for a in _cmdline(raylet).split(" ") if a.startswith("--log_dir="))
    assert "ThresholdMemoryMonitor disabled" in (Path(log_dir) / "raylet.out").read_text()
