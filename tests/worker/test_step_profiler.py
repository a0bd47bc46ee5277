"""A rank's profiler: the trace of what ran between start and stop, under SGLang's name; a
trace that cannot be written costs the rank nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from radixcluster.protocol import Profile
from radixcluster.worker.step_profiler import StepProfiler
from support.profiles import trace_ops


def start(output_dir: Path, **fields) -> Profile:
    return Profile(start=True, output_dir=str(output_dir), profile_id="t", activities=["CPU"], **fields)


def test_the_trace_holds_what_ran_between_start_and_stop(tmp_path):
    profiler = StepProfiler(rank=2)
    profiler.apply(start(tmp_path, prefix="p-", record_shapes=True))
    torch.randn(16, 16) @ torch.randn(16, 16)
    profiler.apply(Profile(start=False))
    assert [f.name for f in tmp_path.iterdir()] == ["p-t-TP-2.trace.json.gz"]  # nothing left aside
    assert "aten::mm" in trace_ops(tmp_path / "p-t-TP-2.trace.json.gz")


def test_nothing_before_the_start_or_after_the_stop_is_recorded(tmp_path):
    profiler = StepProfiler(rank=0)
    profiler.apply(Profile(start=False))  # no profile: nothing to stop
    torch.randn(8, 8) @ torch.randn(8, 8)
    profiler.apply(start(tmp_path))
    torch.randn(8).exp()
    profiler.apply(Profile(start=False))
    torch.randn(8).sin()
    ops = trace_ops(tmp_path / "t-TP-0.trace.json.gz")
    assert "aten::exp" in ops and "aten::mm" not in ops and "aten::sin" not in ops


def test_a_trace_that_cannot_be_written_is_logged_and_the_rank_goes_on(tmp_path, caplog):
    occupied = tmp_path / "a_file"
    occupied.write_text("")
    profiler = StepProfiler(rank=0)
    profiler.apply(start(occupied))  # the directory is a file
    with caplog.at_level(logging.ERROR):
        profiler.apply(Profile(start=False))
    assert f"the profile could not be written to {occupied}" in caplog.text
    profiler.apply(start(tmp_path / "ok"))  # the next profile runs as usual
    profiler.apply(Profile(start=False))
    assert (tmp_path / "ok" / "t-TP-0.trace.json.gz").is_file()
