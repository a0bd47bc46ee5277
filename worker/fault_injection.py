"""Test-only faults, read from ``RADIXCLUSTER_FAULT``: make a rank raise inside a step or die while
loading, the failures a TP group must heal from that a test cannot cause from outside.

The value is a comma-separated list of ``raise:RANK:STEP`` (rank RANK raises in its STEP-th step,
in the first group only: the restarted group must serve) and ``die_on_load:RANK:GENERATION``
(rank RANK exits while loading, in every group from GENERATION on: a crash loop)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ENV = "RADIXCLUSTER_FAULT"


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault throws."""


@dataclass(frozen=True, slots=True)
class Faults:
    """The faults meant for one rank of one group generation."""

    raise_at_step: int | None = None
    die_on_load: bool = False

    @classmethod
    def for_rank(cls, rank: int, generation: int, spec: str | None = None) -> Faults:
        spec = os.environ.get(ENV, "") if spec is None else spec
        raise_at, die = None, False
        for item in filter(None, (part.strip() for part in spec.split(","))):
            kind, target, number = _parse(item)
            if target != rank:
                continue
            if kind == "raise" and generation == 0:
                raise_at = number
            elif kind == "die_on_load" and generation >= number:
                die = True
        if raise_at is not None or die:
            logger.warning("%s: rank %d of group %d will fail on purpose (%s)", ENV, rank, generation, spec)
        return cls(raise_at, die)

    def at_load(self) -> None:
        if self.die_on_load:
            os._exit(3)  # as abrupt as an OOM kill: no cleanup, no report

    def at_step(self, served: int) -> None:
        """``served``: the steps this rank has run before this one."""
        if self.raise_at_step is not None and served + 1 == self.raise_at_step:
            raise InjectedFault(f"{ENV}: injected failure in step {served + 1}")


def _parse(item: str) -> tuple[str, int, int]:
    kind, _, rest = item.partition(":")
    rank, _, number = rest.partition(":")
    if kind not in ("raise", "die_on_load") or not rank.isdigit() or not number.isdigit():
        raise ValueError(f"{ENV}: {item!r} is not raise:RANK:STEP or die_on_load:RANK:GENERATION")
    return kind, int(rank), int(number)
