"""What the router knows of its TP group: the generation that serves, or why none does; the
restart budget; the counters /metrics shows. The launcher replaces groups, the router decides when."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class GroupHealth:
    """``max_restarts``: group losses in a row (no step completed in between) the router asks the
    launcher to repair; one more ends the replica."""

    max_restarts: int
    generation: int = 0
    down_reason: str | None = None  # None while the group serves
    down_since: float = 0.0
    losses_in_a_row: int = 0
    restarts_total: int = 0
    requeued_total: int = 0
    seconds_down_total: float = 0.0

    @property
    def up(self) -> bool:
        return self.down_reason is None

    def lose(self, generation: int, reason: str) -> bool:
        """Mark group ``generation`` lost: the serving one, or a newer one that failed before it
        served (a replacement that died while loading). False for a late report about a group
        already replaced, or already marked: that one's ``reason`` (the launcher's, which names
        the rank whose process died, where the router saw a peer's broken collective) replaces
        the first."""
        if generation == self.generation and not self.up:
            self.down_reason = reason
            return False
        if generation < self.generation:
            return False
        if self.up:
            self.down_since = time.monotonic()
        self.generation, self.down_reason = generation, reason
        self.losses_in_a_row += 1
        return True

    @property
    def budget_spent(self) -> bool:
        return self.losses_in_a_row > self.max_restarts

    def restored(self, generation: int) -> None:
        """Group ``generation`` serves: steps may run again."""
        if not self.up:
            self.seconds_down_total += time.monotonic() - self.down_since
            self.restarts_total += 1
        self.generation, self.down_reason = generation, None

    def stepped(self) -> None:
        """A step completed: the group works, the losses in a row start again from zero."""
        self.losses_in_a_row = 0

    def stats(self) -> dict[str, Any]:
        down_now = 0.0 if self.up else time.monotonic() - self.down_since
        return {
            "worker_restarts_total": self.restarts_total,
            "requeued_requests_total": self.requeued_total,
            "seconds_without_group_total": self.seconds_down_total + down_now,
            "group_up": int(self.up),
            "group_down_reason": self.down_reason,
        }
