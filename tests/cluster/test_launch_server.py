"""`python -m radixcluster.launch_server`: SGLang's launch line with one word changed is `up`."""

from __future__ import annotations

import runpy
import subprocess
import sys

from support.servers import free_port


def launch_server(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "radixcluster.launch_server", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_its_flags_are_those_of_up():
    helped = launch_server("--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: radixcluster up")
    refused = launch_server("--tp-size", "2", "--port", str(free_port()))  # checked before anything starts
    assert refused.returncode == 2 and "--tp-size 2 cannot split" in refused.stderr


def test_a_spawned_child_importing_it_again_starts_nothing():
    runpy.run_module("radixcluster.launch_server", run_name="__mp_main__")
