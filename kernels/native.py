"""The native CPU kernels: build them (cached, see ``native_build``), load them as the
``torch.ops.radixcluster`` operators, and say in one line why not when they cannot be built.

Build ahead of time (``make install`` and the container images do)::

    python -m radixcluster.kernels.native build
"""

from __future__ import annotations

import sys
from functools import cache

import torch

from radixcluster.kernels.native_build import NativeBuildError, build

__all__ = ["NativeBuildError", "head_dim_problem", "load", "say_unavailable", "main"]


@cache
def _load() -> str | NativeBuildError:
    try:
        torch.ops.load_library(str(build()))
    except NativeBuildError as exc:
        return exc
    except OSError as exc:
        return NativeBuildError(f"the built library does not load: {exc}")
    return str(torch.ops.radixcluster.kernel_isa())


def load() -> str:
    """Build (when not cached) and load the kernels, once per process; the instruction set they
    run on (``amx``, ``avx512bf16``, ``avx512``, ``avx2`` or ``scalar``). Raises NativeBuildError, the same every time."""
    result = _load()
    if isinstance(result, NativeBuildError):
        raise result
    return result


def head_dim_problem(head_dim: int) -> str | None:
    """Why the kernels cannot run heads of ``head_dim`` dimensions (their tiles hold 16), or None."""
    return None if head_dim % 16 == 0 else f"they need head_dim to be a multiple of 16, not {head_dim}"


@cache
def say_unavailable(reason: str) -> None:
    """The one line on stderr (once per process) when the torch path stands in for the kernels."""
    print(f"radixcluster: native CPU kernels unavailable ({reason}); using the torch path", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``build``: compile the kernels into their cache (a no-op when cached); exit 1 if that fails."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["build"]:
        print("usage: python -m radixcluster.kernels.native build", file=sys.stderr)
        return 2
    try:
        print(build())
    except NativeBuildError as exc:
        say_unavailable(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
