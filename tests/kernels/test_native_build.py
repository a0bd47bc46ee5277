"""Building the native kernels: cached under a key, one builder at a time, and when they cannot
be built, one line on stderr and the torch path (an explicit ``native`` refuses instead)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radixcluster.kernels.native_build import LIBRARY, NativeBuildError, build, build_key, toolchain


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env={**os.environ, **env}
    )


def test_a_build_is_cached_under_its_key() -> None:
    path = build()
    assert path.name == LIBRARY and path.parent.name == build_key(toolchain())
    assert build() == path


def test_the_cli_prints_the_built_library() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "radixcluster.kernels.native", "build"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == str(build())
    wrong = subprocess.run(
        [sys.executable, "-m", "radixcluster.kernels.native", "compile"], capture_output=True, text=True
    )
    assert wrong.returncode == 2 and "usage" in wrong.stderr


def test_without_a_compiler_the_build_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(NativeBuildError) as failure:
        build(tmp_path)
    message = str(failure.value)
    assert "\n" not in message and "/nonexistent/c++" in message
    log = Path(message.rsplit("full log: ", 1)[1].rstrip(")"))
    assert log.exists() and "/nonexistent/c++" in log.read_text()
    # nothing half-built is left to be mistaken for a build
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".lock", log.name])


def test_auto_serves_on_torch_in_one_line_when_the_kernels_cannot_build() -> None:
    done = python(
        """
        from radixcluster.kernels.attention_backend import select_attention_backend
        from radixcluster.launcher import _attention_backend
        print(select_attention_backend("cpu").name, _attention_backend("auto", "cpu", 64)[0])
        try:
            _attention_backend("native", "cpu", 64)
        except ValueError as exc:
            print("refused:", exc)
        """,
        CXX="/nonexistent/c++",
    )
    assert done.returncode == 0, done.stderr
    first, refused = done.stdout.strip().splitlines()
    assert first == "torch torch" and refused.startswith("refused: --attention-backend native")
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "native CPU kernels unavailable" in lines[0] and "using the torch path" in lines[0]


def test_the_launcher_names_the_kernels_it_builds() -> None:
    from radixcluster.kernels import native
    from radixcluster.launcher import _attention_backend

    assert _attention_backend("auto", "cpu", 64) == ("native", f"attention native ({native.load()} kernels)")
    assert _attention_backend("torch", "cpu", 64) == ("torch", "attention torch")
    assert _attention_backend("auto", "cuda", 64) == ("auto", "attention auto")


def test_heads_the_kernels_cannot_tile_serve_on_torch_unless_native_is_asked(capfd: pytest.CaptureFixture[str]) -> None:
    # OpenLLaMA-3B's heads have 100 dimensions; the kernels' tiles hold 16
    from radixcluster.launcher import _attention_backend

    assert _attention_backend("auto", "cpu", 100) == ("torch", "attention torch")
    assert "(they need head_dim to be a multiple of 16, not 100); using the torch path" in capfd.readouterr().err
    with pytest.raises(ValueError, match="^--attention-backend native: .*multiple of 16, not 72$"):
        _attention_backend("native", "cpu", 72)


@pytest.mark.slow
def test_ranks_building_at_once_compile_once(tmp_path: Path) -> None:
    code = f"""
        from pathlib import Path
        from radixcluster.kernels.native_build import build
        print(build(Path({str(tmp_path)!r})))
        """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    paths = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(paths) == 1
    built = Path(paths.pop())
    assert built.exists() and built.parent.parent == tmp_path
    # one build directory, one log, no leftovers of a second compile
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".lock", built.parent.name, f"{built.parent.name}.log"]
    )
