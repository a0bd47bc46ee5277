"""Markers a model writes in its answer (``<think>``, ``<tool_call>``): how much of a growing
text must be held back because it may yet become one."""

from __future__ import annotations

from collections.abc import Iterable


def marker_tail(text: str, markers: Iterable[str]) -> int:
    """How many characters at the end of ``text`` could begin one of ``markers`` (not a whole one)."""
    return max((k for m in markers for k in range(1, len(m)) if text.endswith(m[:k])), default=0)
