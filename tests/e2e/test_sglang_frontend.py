"""The real SGLang frontend (released `sglang` packages, the seeds' 0.5.6 and the newest 0.5.x)
running unchanged programs against a real `radixcluster up`: the seeds' multi-round chat,
a regex gen, select, stop_regex with logprob text, fork, run_batch and streaming; and the same
programs with radixcluster.lang imported in place of sglang, which must answer as they do."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support.sglang_frontend import SEED_TIMEOUT_S, SEED_VERSION, SGLANG_VERSIONS, run_with_sglang

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).with_name("sglang_frontend_programs.py")


@pytest.fixture(scope="module")
def ours(server, tmp_path_factory) -> dict[str, Any]:
    """The same programs with ``import radixcluster.lang as sgl`` in place of ``import sglang as
    sgl``, as a user swaps the import; no sglang on the path."""
    source = PROGRAMS.read_text()
    assert source.count("import sglang as sgl\n") == 1
    swapped = tmp_path_factory.mktemp("swapped") / PROGRAMS.name
    swapped.write_text(source.replace("import sglang as sgl\n", "import radixcluster.lang as sgl\n"))
    done = subprocess.run([sys.executable, str(swapped), server.url], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.rstrip("\n").split("\n")[-1])


@pytest.fixture(scope="module", params=SGLANG_VERSIONS)
def results(request, server) -> dict[str, Any]:
    """What every program but the seeds' produced, run once per released frontend."""
    return run_with_sglang(request.param, PROGRAMS, server.url)


def test_endpoint_reads_model_and_server_info(results, server):
    assert results["version"] in SGLANG_VERSIONS
    assert results["model_name"].endswith(".gguf")  # the real path of the embedded model
    # SGLang matches model paths by name; SmolLM2 matches none of its templates, so its
    # frontend falls back to its plain "default" template, as against SGLang's own server
    assert results["chat_template"] == "default"
    assert {"model_path", "context_length", "max_total_num_tokens"} <= set(results["server_info_keys"])


# up to 640 tokens: on a loaded 2-core machine this can take many minutes
@pytest.mark.timeout(SEED_TIMEOUT_S + 60)
def test_seed_multi_round_chat_reuses_earlier_rounds(server):
    run = run_with_sglang(SEED_VERSION, PROGRAMS, server.url, "--seed", timeout=SEED_TIMEOUT_S)
    assert all(isinstance(a, str) and a for a in run["answers"])
    metas = run["meta"]
    assert all(m["finish_reason"]["type"] in ("stop", "length") for m in metas)
    assert [m["completion_tokens"] <= limit for m, limit in zip(metas, (256, 256, 128))] == [True] * 3
    for earlier, later in zip(metas, metas[1:]):
        # each round's prompt is the last round's prompt + answer: all of it is cached but a few tokens
        assert later["cached_tokens"] >= earlier["prompt_tokens"] + earlier["completion_tokens"] - 4
    assert "介绍一下Transformer架构" in run["text"] and "能画个结构图吗？" in run["text"]


def test_regex_gen_and_select(results):
    run = results["constrained"]
    assert re.fullmatch(r"(19|20)[0-9]{2}", run["year"])
    assert run["verdict"] in ("yes", "no", "it is a moon")
    # select scores every choice by its prompt logprobs, which the server computed
    scores = run["verdict_meta"]["normalized_prompt_logprobs"]
    assert len(scores) == 3 and all(math.isfinite(s) and s < 0 for s in scores)


def test_stop_regex_ends_the_gen_and_logprobs_carry_text(results):
    run = results["constrained"]
    meta = run["color_meta"]
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == r"[.!\n]"
        assert re.search(r"[.!\n]", run["color"])
    else:
        assert not re.search(r"[.!\n]", run["color"])
    entries = meta["output_token_logprobs"]
    assert len(entries) == meta["completion_tokens"]
    assert "".join(text for _, _, text in entries).startswith(run["color"].rstrip(".!\n"))
    tops = meta["output_top_logprobs"]
    assert all(len(top) == 2 and all(isinstance(text, str) for _, _, text in top) for top in tops)


def test_fork_and_run_batch(results):
    fork = results["fork"]
    assert len(fork["tips"]) == 2 and all("\n" not in tip for tip in fork["tips"]) and any(fork["tips"])
    batch = results["batch"]
    assert [b["text"] for b in batch] == ["Two short tips about sleep:\n", "Two short tips about reading:\n"]
    # greedy: the batch's first program is the single run again
    assert batch[0]["tips"] == fork["tips"]


def test_streamed_gen_arrives_in_pieces_that_add_up(results):
    run = results["stream"]
    assert "".join(run["chunks"]) == run["count"]


def test_the_programs_answer_the_same_with_radixcluster_lang_in_place_of_sglang(results, ours):
    # greedy on one server: both frontends send the same requests for these template-free programs
    assert ours["model_name"] == results["model_name"] and ours["server_info_keys"] == results["server_info_keys"]
    mine, theirs = ours["constrained"], results["constrained"]
    assert (mine["year"], mine["verdict"], mine["color"]) == (theirs["year"], theirs["verdict"], theirs["color"])
    assert mine["verdict_meta"]["normalized_prompt_logprobs"] == pytest.approx(
        theirs["verdict_meta"]["normalized_prompt_logprobs"], abs=1e-4
    )
    entries = [mine["color_meta"]["output_token_logprobs"], theirs["color_meta"]["output_token_logprobs"]]
    assert [[e[1:] for e in side] for side in entries] == [[e[1:] for e in entries[1]]] * 2  # ids and texts
    assert [e[0] for e in entries[0]] == pytest.approx([e[0] for e in entries[1]], abs=1e-4)
    assert ours["fork"] == results["fork"] and ours["batch"] == results["batch"]
    assert "".join(ours["stream"]["chunks"]) == ours["stream"]["count"] == results["stream"]["count"]
