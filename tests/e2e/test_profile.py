"""SGLang's /start_profile and /stop_profile on a real server: torch's profiler records the
model's steps in the rank and writes a Chrome trace where SGLang's body or its environment
variable says; what asks for more than that is refused by name; the released bench_serving's
--profile starts and stops it (its profile calls carry no key: SGLang's profiler, like ours,
takes the admin key when there is one, which test_cache_control checks)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from support.api_helpers import TIMEOUT_S, assert_error, post
from support.profiles import trace_ops, wait_for_traces
from support.servers import ServerHandle, launch_server
from support.sglang_frontend import RUN_TIMEOUT_S, SEED_VERSION, sglang_env

pytestmark = pytest.mark.slow

GENERATE = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}


@pytest.fixture(scope="module")
def env_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("profiler_env_dir")


@pytest.fixture(scope="module")
def server(env_dir: Path) -> Iterator[ServerHandle]:
    with launch_server(env={"SGLANG_TORCH_PROFILER_DIR": str(env_dir)}) as handle:
        yield handle


def profile(server: ServerHandle, action: str, body: dict | None = None) -> requests.Response:
    return requests.post(f"{server.url}/{action}_profile", json=body, timeout=TIMEOUT_S)


def test_a_profile_records_the_steps_between_start_and_stop(server, tmp_path):
    started = profile(
        server, "start", {"output_dir": str(tmp_path / "new"), "profile_id": "run1", "profile_prefix": "p"}
    )
    assert (started.status_code, started.text) == (200, "Start profiling.\n")
    assert post(server, "/generate", GENERATE).status_code == 200
    stopped = profile(server, "stop")
    assert (stopped.status_code, stopped.text) == (200, "Stop profiling. This will take some time.\n")
    # SGLang's naming; the directory is created
    [trace] = wait_for_traces(tmp_path / "new", "p-run1-TP-0.trace.json.gz")
    assert any(op.startswith("aten::") for op in trace_ops(trace))


def test_num_steps_stops_the_profile_by_itself(server, tmp_path):
    assert (
        profile(server, "start", {"output_dir": str(tmp_path), "num_steps": "2", "profile_id": "two"}).status_code
        == 200
    )
    assert post(server, "/generate", GENERATE).status_code == 200  # a prefill and five decode steps
    wait_for_traces(tmp_path, "two-TP-0.trace.json.gz")
    assert_error(profile(server, "stop"), 400, "no profile is running")


def test_sglangs_environment_variable_names_the_default_directory(server, env_dir):
    assert requests.get(server.url + "/start_profile", timeout=TIMEOUT_S).status_code == 200  # no body: the defaults
    assert_error(profile(server, "start", {"output_dir": str(env_dir)}), 400, "a profile is already running")
    assert post(server, "/generate", GENERATE).status_code == 200
    assert requests.get(server.url + "/stop_profile", timeout=TIMEOUT_S).status_code == 200
    wait_for_traces(env_dir, "*-TP-0.trace.json.gz")


@pytest.mark.parametrize(
    "body, said",
    [
        ({"activities": ["CPU", "RPD"]}, "activities ['RPD'] are not recorded here"),
        ({"start_step": 10}, "start_step is not supported"),
        ({"profile_by_stage": True}, "profiling by stage is not supported"),
        ({"merge_profiles": True}, "merge_profiles is not supported"),
        ({"profile_id": "../escape"}, "it names the trace files"),
        ({"num_steps": 0}, "num_steps"),
        ({"num_steps": 1001}, "num_steps: Input should be less than or equal to 1000"),
        ({"num_steps": 10**30}, "num_steps"),
    ],
)
def test_what_is_not_recorded_here_is_refused_by_name(server, body, said):
    assert_error(profile(server, "start", body), 400, said)


def test_an_output_dir_the_server_cannot_write_is_refused(server, tmp_path):
    occupied = tmp_path / "a_file"
    occupied.write_text("")
    assert_error(profile(server, "start", {"output_dir": str(occupied)}), 400, f"output_dir {occupied}")
    assert_error(profile(server, "stop"), 400, "no profile is running")


def test_the_released_bench_serving_profiles_its_run(server, env_dir, hf_tokenizer, tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    hf_tokenizer.save_pretrained(tokenizer_dir)
    before = len(list(env_dir.glob("*.trace.json.gz")))
    command = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", server.url,
        "--tokenizer", str(tokenizer_dir), "--dataset-name", "generated-shared-prefix",
        "--gsp-num-groups", "1", "--gsp-prompts-per-group", "2", "--gsp-system-prompt-len", "32",
        "--gsp-question-len", "8", "--gsp-output-len", "2", "--profile",
    ]  # fmt: skip
    env = {
        **sglang_env(SEED_VERSION),
        "HOME": str(tmp_path),
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Profiler started" in done.stdout and "Profiler stopped" in done.stdout, done.stdout[-2000:]
    wait_for_traces(env_dir, "*.trace.json.gz", before + 1)
