"""The launchers' stop request, set from their SIGTERM / SIGINT handlers: a flag, and a wait that
polls it. Not a ``threading.Event``: its ``set()`` takes a lock, and a signal handled while that
lock was held (by the main thread inside ``Event.wait``, or by a first handler's own ``set()``
when a second signal came, as ``pkill -f radixcluster`` and the command's relay deliver two)
deadlocked the command, which then ignored every later SIGTERM."""

from __future__ import annotations

import time

POLL_S = 0.05  # how soon a wait sees the flag once it is set


class StopFlag:
    """Set once, never cleared; reading and setting it take no lock."""

    def __init__(self) -> None:
        self._set_at: float | None = None

    def set(self) -> None:
        if self._set_at is None:
            self._set_at = time.monotonic()

    def is_set(self) -> bool:
        return self._set_at is not None

    def seconds_set(self) -> float:
        """How long ago it was first set (0 if it is not)."""
        return 0.0 if self._set_at is None else time.monotonic() - self._set_at

    def wait(self, timeout: float) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` s for it."""
        deadline = time.monotonic() + timeout
        while self._set_at is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, POLL_S))
        return True
