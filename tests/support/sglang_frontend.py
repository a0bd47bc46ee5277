"""The released SGLang frontends that `make install` puts beside the venv, and running a
script with one of them, in its own process (importing sglang patches transformers, which
the reference tests in this process use)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# the versions the Makefile installs (SGLANG_FRONTENDS): the seeds' own and the newest 0.5.x
SEED_VERSION = "0.5.6"
SGLANG_VERSIONS = (SEED_VERSION, "0.5.23")
RUN_TIMEOUT_S = 540  # under the suite's 600 s per test
SEED_TIMEOUT_S = 1200  # the seeds' program, up to 640 tokens


def frontend_dir(version: str) -> Path:
    """Where `make install` put ``sglang==version`` (installed with --no-deps)."""
    path = Path(sys.prefix) / f"sglang-{version}"
    if not (path / "sglang" / "__init__.py").is_file():
        raise FileNotFoundError(f"sglang {version} is not installed in {path}: run `make install`")
    return path


def sglang_env(version: str) -> dict[str, str]:
    """This process's environment with the released ``sglang`` of ``version`` importable."""
    return {**os.environ, "PYTHONPATH": str(frontend_dir(version))}


def run_with_sglang(version: str, script: Path, *args: str, timeout: float = RUN_TIMEOUT_S) -> Any:
    """Run ``script`` with the released ``sglang`` of ``version`` importable; its last stdout
    line, as JSON."""
    done = subprocess.run(
        [sys.executable, str(script), *args], env=sglang_env(version), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"{script.name} under sglang {version} failed:\n{done.stderr[-4000:]}")
    # "\n" only: the JSON keeps the generated text's U+2028 or NEL unescaped, which splitlines() splits at
    return json.loads(done.stdout.rstrip("\n").split("\n")[-1])
