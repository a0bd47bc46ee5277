"""``--log-requests``: one line when the router queues a request and one when it ends (its id,
tenant, counts, finish reason or error, and seconds), never the prompt's or the answer's text,
on the logger ``radixcluster.requests`` whatever ``--log-level`` says. The server's own probes
(``/health_generate``, in no statistic either) are not logged: one every few seconds would bury
the users' requests."""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from radixcluster.protocol import RequestOutput
from radixcluster.router.request import Request

logger = logging.getLogger("radixcluster.requests")
# a client's request id, or its field names in an error, with a newline in it forged log lines
# (C0 and C1 controls, and the line and paragraph separators that some readers break lines at)
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160))} | {c: f"\\u{c:04x}" for c in (0x2028, 0x2029)}

T = TypeVar("T")


class RequestLog:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._queued_at: dict[str, float] = {}
        self._probes: set[str] = set()
        logger.setLevel(logging.INFO if enabled else logging.WARNING)

    def queued(self, request: Request) -> None:
        if not self.enabled:
            return
        if not request.log_metrics:
            self._probes.add(request.rid)
            return
        self._queued_at[request.rid] = time.monotonic()
        s = request.sampling
        logger.info(
            "request %s queued: %d prompt tokens, max_new_tokens %d, temperature %g, tenant %s",
            _shown(request.rid),
            request.prompt_len,
            s.max_new_tokens,
            s.temperature,
            request.tenant or "-",
        )

    def ended(self, outputs: list[T]) -> list[T]:
        """Log the requests that ``outputs`` end; returns ``outputs``."""
        if not self.enabled:
            return outputs
        for out in outputs:
            if isinstance(out, RequestOutput) and out.finished:
                self._end(out)
        return outputs

    def _end(self, out: RequestOutput) -> None:
        if out.rid in self._probes:
            self._probes.discard(out.rid)
            return
        start = self._queued_at.pop(out.rid, None)
        took = f", {time.monotonic() - start:.3f} s" if start is not None else ""
        if out.error is not None:
            logger.info("request %s failed (%d): %s%s", _shown(out.rid), out.status, _shown(out.error), took)
            return
        reason = (out.finish_reason or {}).get("type", "-")
        logger.info(
            "request %s ended (%s): %d prompt tokens, %d cached, %d generated%s",
            _shown(out.rid),
            reason,
            out.prompt_tokens,
            out.cached_tokens,
            out.completion_tokens,
            took,
        )


def _shown(text: str) -> str:
    """``text`` with its control characters escaped: a log line stays one line."""
    return text.translate(_ESCAPED)
