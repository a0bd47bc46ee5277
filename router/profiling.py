"""SGLang's /start_profile and /stop_profile on the router's side: which profile runs, the steps
it has left, and the Profile messages the router process owes the ranks (sent between steps)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from radixcluster.protocol import MAX_PROFILE_STEPS, Profile

logger = logging.getLogger(__name__)


class ProfileRefused(ValueError):
    """A start while a profile runs, or a stop while none does; the message says which."""


@dataclass(slots=True)
class ProfileControl:
    tp_size: int
    running: Profile | None = None
    steps_left: int = 0  # of the running profile
    outbox: list[Profile] = field(default_factory=list)

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        """Start a profile from the api's checked arguments (those of Profile, and
        ``num_steps``); the traces each rank will write."""
        if self.running is not None:
            raise ProfileRefused("a profile is already running: POST /stop_profile first")
        self.running = msg = Profile(
            start=True,
            output_dir=args["output_dir"],
            profile_id=args["profile_id"],
            prefix=args["prefix"],
            activities=list(args["activities"]),
            with_stack=bool(args["with_stack"]),
            record_shapes=bool(args["record_shapes"]),
        )
        self.steps_left = args.get("num_steps") or MAX_PROFILE_STEPS
        self.outbox.append(msg)
        files = self._trace_files(msg)
        logger.info("profiling at most %d steps; traces go to %s", self.steps_left, ", ".join(files))
        return {"trace_files": files}

    def stop(self) -> dict[str, Any]:
        if self.running is None:
            raise ProfileRefused("no profile is running: POST /start_profile first")
        files = self._trace_files(self.running)
        self._stop()
        return {"trace_files": files}

    def stepped(self) -> None:
        """A model step ran: a profile of ``num_steps`` steps (at most MAX_PROFILE_STEPS) stops
        after its last."""
        if self.running is None:
            return
        self.steps_left -= 1
        if self.steps_left <= 0:
            logger.info("the profile %s has recorded its steps; the ranks write it", self.running.profile_id)
            self._stop()

    def group_lost(self) -> None:
        """The ranks, and the profile they recorded, are gone."""
        if self.running is not None:
            logger.warning("the profile %s ended with the TP group, unwritten", self.running.profile_id)
        self.running, self.steps_left = None, 0
        self.outbox.clear()

    def take(self) -> list[Profile]:
        """The messages owed to the ranks, in order; the outbox empties."""
        owed, self.outbox = self.outbox, []
        return owed

    def _trace_files(self, msg: Profile) -> list[str]:
        return [msg.trace_file(rank) for rank in range(self.tp_size)]

    def _stop(self) -> None:
        self.running, self.steps_left = None, 0
        self.outbox.append(Profile(start=False))
