"""One rank's torch profiler, started and stopped by the router's Profile messages (SGLang's
/start_profile and /stop_profile): it records the model steps in between and writes one
Chrome trace per rank, which chrome://tracing or Perfetto opens."""

from __future__ import annotations

import contextlib
import logging
import os

import torch
from torch.profiler import ProfilerActivity

from radixcluster.protocol import Profile

logger = logging.getLogger(__name__)


class StepProfiler:
    """At most one profile at a time, on this rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._profiler: torch.profiler.profile | None = None
        self._started: Profile | None = None

    def apply(self, msg: Profile) -> None:
        """Start or stop as told. A trace that cannot be written is logged, never raised: the
        rank serves on whatever the profiler does."""
        if msg.start:
            self._stop()  # the router never starts twice; a stale profile is not worth keeping
            activities = [ProfilerActivity.CPU] if "CPU" in msg.activities else []
            if "GPU" in msg.activities and torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            profiler = torch.profiler.profile(
                activities=activities or [ProfilerActivity.CPU],
                with_stack=msg.with_stack,
                record_shapes=msg.record_shapes,
                profile_memory="MEM" in msg.activities,
            )
            try:
                profiler.start()
            except Exception:
                logger.exception("rank %d: the profiler did not start", self.rank)
                return
            self._profiler, self._started = profiler, msg
            return
        self._stop()

    def _stop(self) -> None:
        profiler, started = self._profiler, self._started
        if profiler is None or started is None:
            return
        self._profiler = self._started = None
        path = started.trace_file(self.rank)
        # written aside (a hidden name, ending in .gz so that torch compresses it) and renamed:
        # whoever waits for the trace never reads half of it
        partial = os.path.join(started.output_dir, f".{os.path.basename(path)}.partial.gz")
        try:
            profiler.stop()
            os.makedirs(started.output_dir, exist_ok=True)
            profiler.export_chrome_trace(partial)
            os.replace(partial, path)
        except Exception:
            logger.exception("rank %d: the profile could not be written to %s", self.rank, path)
            with contextlib.suppress(OSError):
                os.unlink(partial)
            return
        logger.info("rank %d: profile written to %s", self.rank, path)
