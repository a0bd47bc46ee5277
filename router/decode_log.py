"""SGLang's ``--decode-log-interval``: every N decode steps one INFO line on the batch (its size,
the requests queued, the KV pool's use) and the tokens those N steps decoded per second of their
own time (idle time and prefill steps between them do not count). That rate is also SGLang's
``last_gen_throughput`` in /server_info, until it is stale."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# SGLang's: a rate measured longer ago than this is reported as 0 (decoding stopped)
GEN_THROUGHPUT_STALE_S = 30.0


@dataclass(slots=True)
class DecodeLog:
    interval: int
    _steps: int = 0
    _tokens: int = 0
    _seconds: float = 0.0
    _rate: float = 0.0  # tokens/s over the last full interval
    _rate_at: float = 0.0  # when it was measured (time.monotonic)

    def stepped(self, batch: int, seconds: float, queued: int, pool_used: float) -> None:
        """A decode step of ``batch`` requests ended after ``seconds``; ``pool_used``: the KV
        pool's share in use."""
        self._steps += 1
        self._tokens += batch
        self._seconds += seconds
        if self._steps % self.interval:
            return
        self._rate, self._rate_at = self._tokens / max(self._seconds, 1e-9), time.monotonic()
        logger.info(
            "decode: a batch of %d, %d queued, KV pool %.1f%% used, %.1f tokens/s decoded over the last %d steps",
            batch,
            queued,
            100 * pool_used,
            self._rate,
            self.interval,
        )
        self._tokens, self._seconds = 0, 0.0

    def gen_throughput(self) -> float:
        """The last interval's tokens/s, 0 once it is older than GEN_THROUGHPUT_STALE_S."""
        fresh = self._rate_at and time.monotonic() - self._rate_at <= GEN_THROUGHPUT_STALE_S
        return self._rate if fresh else 0.0
