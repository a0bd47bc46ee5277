"""SGLang's ``--decode-log-interval``: every N decode steps one INFO line on the batch (its size,
the requests queued, the KV pool's use) and the tokens those N steps decoded per second of their
own time (idle time and prefill steps between them do not count)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class DecodeLog:
    interval: int
    _steps: int = 0
    _tokens: int = 0
    _seconds: float = 0.0

    def stepped(self, batch: int, seconds: float, queued: int, pool_used: float) -> None:
        """A decode step of ``batch`` requests ended after ``seconds``; ``pool_used``: the KV
        pool's share in use."""
        self._steps += 1
        self._tokens += batch
        self._seconds += seconds
        if self._steps % self.interval:
            return
        logger.info(
            "decode: a batch of %d, %d queued, KV pool %.1f%% used, %.1f tokens/s decoded over the last %d steps",
            batch,
            queued,
            100 * pool_used,
            self._tokens / max(self._seconds, 1e-9),
            self.interval,
        )
        self._tokens, self._seconds = 0, 0.0
