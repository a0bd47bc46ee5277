"""Compiles the native CPU kernels (``kernels/csrc``) into a cache directory, once per torch
version, compiler, flags and source text. One kernel library per instruction set, each built
with its own ``-m`` flags and loaded only where the CPU has them, beside one torch binding.

Safe when several processes build at once: a file lock, and a build directory renamed into
place only when complete. ``MAX_JOBS`` caps parallel compiler processes, as torch's own builds do.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import cpp_extension

SOURCES = Path(__file__).resolve().parent / "csrc"
LIBRARY = "libradixcluster_kernels.so"
KERNEL_SOURCES = ("attention.cpp", "elementwise.cpp", "matvec.cpp", "isa_table.cpp")
BINDING_SOURCES = ("ops.cpp", "plan.cpp")
COMMON_FLAGS = (
    "-O3",
    "-std=c++20",
    "-fPIC",
    "-fopenmp",
    # fp32 results rounded where the torch reference rounds: no silent a * b + c fusion
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    "-Wall",
    "-Wno-unused-function",
)
# GCC 12's own AVX-512 headers trip its -Wmaybe-uninitialized (GCC bug 105593)
AVX512 = (
    "-DRC_ISA_AVX512",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mavx2",
    "-mfma",
    "-Wno-maybe-uninitialized",
    "-Wno-uninitialized",
)
AVX512_BF16 = (*AVX512, "-DRC_ISA_AVX512_BF16", "-mavx512bf16")
X86_ISAS = {
    # avx512bf16 with attention on AMX tiles (kernels/csrc/attention_amx.h)
    "amx": (*AVX512_BF16, "-DRC_ISA_AMX", "-mamx-tile", "-mamx-bf16"),
    "avx512bf16": AVX512_BF16,
    "avx512": AVX512,
    "avx2": ("-DRC_ISA_AVX2", "-mavx2", "-mfma"),
    "scalar": (),
}


class NativeBuildError(RuntimeError):
    """The kernels could not be compiled; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    compiler: str
    isas: dict[str, tuple[str, ...]]
    binding_flags: tuple[str, ...]
    link_flags: tuple[str, ...]


def toolchain() -> Toolchain:
    """The compiler (``CXX``, else ``c++``) and the flags for this machine's architecture."""
    x86 = platform.machine() in ("x86_64", "AMD64")
    includes = tuple(f"-I{path}" for path in cpp_extension.include_paths())
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    torch_lib = cpp_extension.library_paths()[0]
    return Toolchain(
        compiler=os.environ.get("CXX", "c++"),
        isas=X86_ISAS if x86 else {"scalar": ()},
        binding_flags=(*includes, abi, *(("-DRC_X86",) if x86 else ())),
        link_flags=(f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}"),
    )


def cache_dirs() -> list[Path]:
    """Where builds are looked for, in order, and made in the first writable one: inside the
    environment (``make install`` and image builds put them there, readable by every user of
    it), then the user's cache (an environment that is read-only and lacks the build)."""
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return [Path(sys.prefix) / "var" / "radixcluster" / "kernels", user / "radixcluster" / "kernels"]


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK)


def build_key(tools: Toolchain) -> str:
    """Names one build: torch, the compiler's name, flags and every source file (a cached build
    is found without running the compiler)."""
    h = hashlib.sha256()
    for part in (torch.__version__, repr(tools), repr(COMMON_FLAGS), platform.machine()):
        h.update(part.encode())
    for source in sorted(SOURCES.iterdir()):
        h.update(source.name.encode())
        h.update(source.read_bytes())
    return h.hexdigest()[:16]


def build(cache_dir: Path | None = None) -> Path:
    """The path of the built binding library, compiling it first when no cache holds this
    build (``cache_dir``: the one cache to use, instead of ``cache_dirs()``)."""
    tools = toolchain()
    key = build_key(tools)
    dirs = [cache_dir] if cache_dir is not None else cache_dirs()
    for d in dirs:
        if (d / key / LIBRARY).exists():
            return d / key / LIBRARY
    target = next((d for d in dirs if _writable(d)), None)
    if target is None:
        raise NativeBuildError(f"no writable cache directory among {[str(d) for d in dirs]}")
    final = target / key
    with open(target / ".lock", "w") as lock:
        # one builder at a time; the others find its result when they get the lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / LIBRARY).exists():
            _compile_into(final, tools)
    return final / LIBRARY


def _compile_into(final: Path, tools: Toolchain) -> None:
    work = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    log = final.with_name(f"{final.name}.log")
    commands = [
        _compile(tools, isa, flags, source, work) for isa, flags in tools.isas.items() for source in KERNEL_SOURCES
    ]
    commands += [_compile(tools, "binding", tools.binding_flags, source, work) for source in BINDING_SOURCES]
    jobs = int(os.environ.get("MAX_JOBS", os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(_run, commands))
    links = [_link_kernels(tools, isa, work) for isa in tools.isas]
    results += [_run(cmd) for cmd in links]
    results.append(_run(_link_binding(tools, work)))
    log.write_text("\n\n".join(f"$ {' '.join(cmd)}\n{out}" for cmd, out, _ in results))
    failed = next((r for r in results if r[2] != 0), None)
    if failed is not None:
        shutil.rmtree(work, ignore_errors=True)
        first_error = next((line for line in failed[1].splitlines() if "error" in line), failed[1].strip()[:200])
        raise NativeBuildError(f"compiling failed: {first_error} (full log: {log})")
    for obj in work.glob("*.o"):
        obj.unlink()
    work.rename(final)


def _compile(tools: Toolchain, name: str, flags: tuple[str, ...], source: str, work: Path) -> list[str]:
    isa_define = () if name == "binding" else (f"-DRC_ISA={name}",)
    out = work / f"{name}-{Path(source).stem}.o"
    return [tools.compiler, *COMMON_FLAGS, *flags, *isa_define, "-c", str(SOURCES / source), "-o", str(out)]


def _link_kernels(tools: Toolchain, isa: str, work: Path) -> list[str]:
    objects = [str(work / f"{isa}-{Path(s).stem}.o") for s in KERNEL_SOURCES]
    return [tools.compiler, "-shared", "-fopenmp", *objects, "-o", str(work / f"librc_{isa}.so")]


def _link_binding(tools: Toolchain, work: Path) -> list[str]:
    objects = [str(work / f"binding-{Path(s).stem}.o") for s in BINDING_SOURCES]
    kernel_libs = [f"-lrc_{isa}" for isa in tools.isas]
    return [
        tools.compiler,
        "-shared",
        *objects,
        f"-L{work}",
        *kernel_libs,
        "-Wl,-rpath,$ORIGIN",
        *tools.link_flags,
        "-o",
        str(work / LIBRARY),
    ]


def _run(cmd: list[str]) -> tuple[list[str], str, int]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        return cmd, f"error: cannot run {cmd[0]}: {exc}", 1
    return cmd, done.stdout + done.stderr, done.returncode
