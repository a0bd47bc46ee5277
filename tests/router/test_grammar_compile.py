"""The compile probe with the real SmolLM2 tokenizer and real child processes: a spec that runs
past its CPU time is stopped with its process (the next spec gets a fresh one), a child kept off
the CPU makes no spec too slow, a request's wait that runs out is the server's busyness, a bad
spec says why from the child, and the child never outlives a SIGKILLed router."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from radixcluster.process_tree import is_running
from radixcluster.router.grammar import tokenizer_info
from radixcluster.router.grammar_compile import CompileProbe, GrammarBusy, GrammarError, Wait
from radixcluster.router.text.tokenizer import load_tokenizer
from support.streams import wait_gone

VOCAB = 49152
# xgrammar takes ~15 s on this on the CI machine (counted repetitions of every length to 199)
SLOW_REGEX = "(" + "|".join(f"[a-z]{{{n}}}" for n in range(1, 200)) + ")"


@pytest.fixture(scope="module")
def info(model_path):
    return tokenizer_info(load_tokenizer(model_path), VOCAB)


def test_a_spec_past_its_time_is_stopped_with_its_process_and_the_next_spec_gets_a_fresh_one(info):
    probe = CompileProbe(info)
    try:
        started = time.monotonic()
        with pytest.raises(GrammarError, match=r"^the regex did not compile within 3 s of compute: simplify it$"):
            probe.check("regex", SLOW_REGEX, True, 3.0, Wait.starting_now(600.0))
        assert time.monotonic() - started >= 3.0
        assert probe.pid is None  # stopped, not left compiling
        probe.check("regex", "[0-9]{3}", True, 30.0, Wait.starting_now(30.0))
        child = probe.pid
        assert child is not None and is_running(child)
    finally:
        probe.close()
    assert probe.pid is None and not is_running(child)


def test_a_bad_spec_says_why_from_the_child_and_no_time_left_is_busy_at_once(info):
    probe = CompileProbe(info)
    try:
        with pytest.raises(GrammarError, match="invalid json_schema: .*Failed to parse JSON"):
            probe.check("json_schema", '{"type": "object"', True, 30.0, Wait.starting_now(30.0))
        probe.check("json_schema", '{"type": "object"}', False, 30.0, Wait.starting_now(30.0))
        with pytest.raises(GrammarBusy, match=r"^the server could not compile the ebnf within 10 s \(busy\): retry$"):
            probe.check("ebnf", 'root ::= "a"', True, 30.0, Wait(10.0, time.monotonic()))
    finally:
        probe.close()


def test_a_spec_is_timed_by_its_compile_not_by_a_machine_too_busy_to_run_it(info):
    """The child held off the CPU (SIGSTOP, as a loaded machine would starve it) for longer
    than the spec's CPU time: the spec still compiles; past the request's wait, it is busy."""
    probe = CompileProbe(info)
    try:
        probe.check("regex", "[a-z]{2}", True, 30.0, Wait.starting_now(60.0))  # the child is up
        child = probe.pid
        os.kill(child, signal.SIGSTOP)
        done = []
        check = threading.Thread(
            target=lambda: done.append(probe.check("regex", "[0-9]{5}", True, 1.0, Wait.starting_now(60.0)))
        )
        check.start()
        time.sleep(2.5)
        os.kill(child, signal.SIGCONT)
        check.join(60)
        assert done == [None] and probe.pid == child
        os.kill(child, signal.SIGSTOP)
        with pytest.raises(GrammarBusy, match="within 2 s"):
            probe.check("regex", "[0-9]{6}", True, 1.0, Wait.starting_now(2.0))
        assert probe.pid is None and wait_gone({child}, deadline_s=10.0) == set()  # stopped with it
    finally:
        probe.close()


def test_a_child_that_died_idle_is_replaced_and_one_that_dies_compiling_fails_its_spec(info):
    probe = CompileProbe(info)
    try:
        probe.check("regex", "[a-z]{2}", True, 30.0, Wait.starting_now(30.0))
        idle = probe.pid
        os.kill(idle, signal.SIGKILL)  # as the OOM killer would pick it between specs
        assert wait_gone({idle}, deadline_s=10.0) == set()
        # and its other thread too (a zombie whose threads still exit is not reaped yet)
        deadline = time.monotonic() + 10.0
        while len(os.listdir(f"/proc/{idle}/task")) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        probe.check("regex", "[a-z]{3}", True, 30.0, Wait.starting_now(30.0))  # served by a new child
        assert probe.pid not in (None, idle)
        errors: list[str] = []

        def compile_slow() -> None:
            try:
                probe.check("regex", SLOW_REGEX, True, 600.0, Wait.starting_now(600.0))
            except RuntimeError as exc:
                errors.append(str(exc))

        compiling = threading.Thread(target=compile_slow)
        compiling.start()
        time.sleep(2.0)
        os.kill(probe.pid, signal.SIGKILL)
        compiling.join(60)
        assert errors == ["the grammar compile process exited"]
        probe.check("regex", "[a-z]{4}", True, 30.0, Wait.starting_now(30.0))
    finally:
        probe.close()


def test_the_child_ends_when_its_router_is_killed_in_the_middle_of_a_compile(model_path, tmp_path):
    """A stand-in router process: its probe compiles the slow regex when it is SIGKILLed."""
    script = textwrap.dedent(
        f"""
        import threading, time
        from pathlib import Path
        from radixcluster.router.grammar import tokenizer_info
        from radixcluster.router.grammar_compile import CompileProbe, Wait
        from radixcluster.router.text.tokenizer import load_tokenizer

        if __name__ == "__main__":
            probe = CompileProbe(tokenizer_info(load_tokenizer(Path({str(model_path)!r})), {VOCAB}))
            args = ("regex", {SLOW_REGEX!r}, True, 600.0, Wait.starting_now(600.0))
            threading.Thread(target=probe.check, args=args, daemon=True).start()
            while probe.pid is None:
                time.sleep(0.05)
            time.sleep(3.0)  # the child has loaded and is compiling
            print(probe.pid, flush=True)
            time.sleep(600)
        """
    )
    (tmp_path / "router.py").write_text(script)
    router = subprocess.Popen([sys.executable, str(tmp_path / "router.py")], stdout=subprocess.PIPE, text=True)
    try:
        child = int(router.stdout.readline())
        os.kill(router.pid, signal.SIGKILL)
        router.wait()
        assert wait_gone({child}, deadline_s=10.0) == set()
    finally:
        router.kill()
