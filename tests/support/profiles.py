"""Reading what /start_profile and /stop_profile leave behind: each rank's Chrome trace."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

TRACE_TIMEOUT_S = 60  # a rank writes its trace after the stop, between steps


def wait_for_traces(directory: Path, pattern: str, count: int = 1) -> list[Path]:
    """The ``count`` traces matching ``pattern`` in ``directory``, once all are written."""
    deadline = time.monotonic() + TRACE_TIMEOUT_S
    while len(found := sorted(directory.glob(pattern))) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} traces {pattern} in {directory}: {found}"
        time.sleep(0.2)
    return found


def trace_ops(path: Path) -> set[str]:
    """The names of the operators a Chrome trace recorded."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return {e["name"] for e in events if e.get("cat") == "cpu_op"}
