"""`radixcluster bench`: the ideal-reuse trie on hand-made prompts, and a tiny shared-prefix
run against a real server (table, JSON, PNG)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from radixcluster.bench.workloads import ideal_cached_tokens, multi_tenant, shared_prefix
from radixcluster.cli import main
from radixcluster.router.text.tokenizer import load_tokenizer
from support.servers import ServerHandle, radixcluster_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_ideal_counts_prefixes_seen_earlier_in_submission_order() -> None:
    prompts = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9], [7, 8], [1, 2, 3, 4, 6], [1, 2, 3, 4]]
    # second: [1,2,3] seen; third: [1,2]; fourth: nothing; fifth: all of the first;
    # sixth: the whole prompt was seen, but its last token is always computed
    assert ideal_cached_tokens(prompts) == [0, 3, 2, 0, 4, 3]


def test_ideal_counts_earlier_outputs_but_their_last_token() -> None:
    # turn 2 resends turn 1's prompt and answer: the answer's last token never had its KV computed
    prompts = [[1, 2, 3], [1, 2, 3, 10, 11, 12, 4, 5]]
    outputs = [[10, 11, 12], [20]]
    assert ideal_cached_tokens(prompts, outputs) == [0, 5]
    assert ideal_cached_tokens(prompts) == [0, 3]
    assert ideal_cached_tokens([]) == []
    assert ideal_cached_tokens([[5], [5]]) == [0, 0]


def test_multi_tenant_interleaves_the_shared_prefix_requests(model_path) -> None:
    tokenizer = load_tokenizer(model_path)
    shared = shared_prefix(tokenizer, 5, 3, prefix_len=40, question_len=8, output_len=4, seed=3)
    mixed = multi_tenant(tokenizer, 5, 3, prefix_len=40, question_len=8, output_len=4, seed=3)
    prompts = [c.segments[0] for c in mixed.conversations]
    assert sorted(prompts) == sorted(c.segments[0] for c in shared.conversations)
    assert prompts != [c.segments[0] for c in shared.conversations]  # not group after group
    tenant = {tuple(p[:40]): i for i, p in enumerate(c.segments[0] for c in shared.conversations[::3])}
    order = [tenant[tuple(p[:40])] for p in prompts]
    assert sorted(order) == sorted(list(range(5)) * 3) and order != sorted(order)
    assert prompts == [c.segments[0] for c in multi_tenant(tokenizer, 5, 3, 40, 8, 4, seed=3).conversations]
    assert ideal_cached_tokens(prompts).count(0) == 1  # every tenant's first request shares the template


@pytest.mark.slow
def test_bench_shared_prefix_against_a_real_server(server: ServerHandle, tmp_path: Path) -> None:
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    groups, per_group, prefix_len, question_len = 2, 2, 64, 24
    # a proxy that takes connections and never answers, which a server on this machine skips
    tarpit = socket.create_server(("127.0.0.1", 0))
    proxy = f"http://127.0.0.1:{tarpit.getsockname()[1]}"
    # the shared server: flushed first, so that the cached tokens are the run's own
    run = subprocess.run(
        [
            *radixcluster_command(),
            "bench",
            "--base-url",
            server.url,
            "--workload",
            "shared-prefix",
            "--groups",
            str(groups),
            "--requests-per-group",
            str(per_group),
            "--prefix-len",
            str(prefix_len),
            "--question-len",
            str(question_len),
            "--output-len",
            "8",
            "--label",
            "tiny",
            "--no-progress",
            "--flush-cache",
            "--output-json",
            str(out_json),
            "--output-png",
            str(out_png),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HTTP_PROXY": proxy, "http_proxy": proxy},
    )
    tarpit.close()
    assert run.returncode == 0, run.stderr
    header, row = run.stdout.strip().splitlines()[-2:]
    for column in ("req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "cached", "ideal"):
        assert column in header
    assert row.split()[:3] == ["tiny", "shared-prefix", str(groups * per_group)]

    result = json.loads(out_json.read_text())
    s = result["summary"]
    assert s["completed"] == groups * per_group and s["errors"] == 0
    assert s["output_tokens"] == groups * per_group * 8
    assert s["prompt_tokens"] == groups * per_group * (prefix_len + question_len)
    for key in ("ttft_s", "itl_s", "e2e_latency_s"):
        assert set(s[key]) == {"mean", "p50", "p90", "p99"}
        assert 0 < s[key]["p50"] <= s[key]["p99"]
    assert s["request_throughput"] > 0 and s["output_throughput"] > 0
    # Every group's later request can reuse the whole prefix; every group's first request only
    # the chat-template tokens that open the system message, where an earlier group ran first.
    first_of_group = [r for r in result["requests"] if r["conversation"] % per_group == 0]
    assert len(first_of_group) == groups
    system_open = 3  # "<|im_start|>system\n" in SmolLM2's ChatML
    ideal = (groups * (per_group - 1) * prefix_len + (groups - 1) * system_open) / s["prompt_tokens"]
    assert s["ideal_cached_ratio"] == pytest.approx(ideal)
    assert 0 < s["cached_ratio"] <= s["ideal_cached_ratio"] + 1e-9
    assert result["config"]["workload"] == "shared-prefix" and result["config"]["prefix_len"] == prefix_len
    assert len(result["requests"]) == groups * per_group

    assert out_png.read_bytes()[:8] == PNG_MAGIC
    replot = tmp_path / "again.png"
    run = subprocess.run(
        [*radixcluster_command(), "bench", "plot", str(out_json), str(out_json), "-o", str(replot)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert replot.read_bytes()[:8] == PNG_MAGIC


def test_bad_bench_input_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    """No traceback: a rate, concurrency or count of 0 (a warm-up below 0), results that are
    missing or are not results."""
    for flag, value, says in (
        ("--request-rate", "0", "must be above 0, got 0"),
        ("--max-concurrency", "0", "must be above 0, got 0"),
        ("--num-prompts", "-1", "must be above 0, got -1"),
        ("--output-len", "0", "must be above 0, got 0"),
        ("--warmup", "-1", "must be 0 or more, got -1"),
    ):
        with pytest.raises(SystemExit):
            main(["bench", flag, value])
        assert f"argument {flag}: {says}" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"summary_of": 1}')
    for path, words in ((tmp_path / "missing.json", "cannot read bench results"), (other, "not results of")):
        assert main(["bench", "plot", str(path), "-o", str(tmp_path / "x.png")]) == 2
        assert f"{path}: {words}" in capsys.readouterr().err
