"""Programs written for SGLang's own frontend (``import sglang as sgl``), run by the real
``sglang`` package against a radixcluster server, as a user would run them.

``python sglang_frontend_programs.py URL`` prints one JSON object with what each program
produced; with ``--seed``, what the seeds' program (up to 640 tokens) produced;
tests/e2e/test_sglang_frontend.py runs it with a released ``sglang`` on the path. It imports
nothing of radixcluster.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import sglang as sgl


# The seeds' multi-round program (shared/seeds/003, section 4.2) verbatim, but for its last
# line, `state.get_cache_hit_info()`, which is radixcluster.lang's.
@sgl.function
def multi_round_chat(s):
    # 第一轮提问
    s += sgl.system("你是一个AI助手，回答要准确简洁。")
    s += sgl.user("介绍一下Transformer架构")
    s += sgl.assistant(sgl.gen("answer1", max_tokens=256))

    # 第二轮追问（自动继承上下文）
    s += sgl.user("它和RNN有什么区别？")
    s += sgl.assistant(sgl.gen("answer2", max_tokens=256))

    # 第三轮再追问
    s += sgl.user("能画个结构图吗？")
    s += sgl.assistant(sgl.gen("answer3", max_tokens=128))


@sgl.function
def year_and_verdict(s):
    s += "Q: In which year did the Apollo 11 mission land on the Moon?\nA: " + sgl.gen(
        "year", max_tokens=8, regex=r"(19|20)[0-9]{2}"
    )
    s += "\nQ: Is the Moon a planet?\nA: " + sgl.select("verdict", choices=["yes", "no", "it is a moon"])
    s += "\nQ: Name a color.\nA:" + sgl.gen(
        "color",
        max_tokens=6,
        stop_regex=r"[.!\n]",
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )


@sgl.function
def tips(s, topic):
    s += "Two short tips about " + topic + ":\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + sgl.gen("tip", max_tokens=8, stop="\n")
    forks.join()


@sgl.function
def streamed(s):
    s += "Count from one to five: one," + sgl.gen("count", max_tokens=8)


def run_seed(url: str) -> dict[str, Any]:
    state = multi_round_chat.run(backend=sgl.RuntimeEndpoint(url))
    return {
        "answers": [state[f"answer{i}"] for i in (1, 2, 3)],
        "meta": [state.get_meta_info(f"answer{i}") for i in (1, 2, 3)],
        "text": state.text(),
    }


def run_all(url: str) -> dict[str, Any]:
    backend = sgl.RuntimeEndpoint(url)
    results: dict[str, Any] = {
        "version": sgl.__version__,
        "chat_template": backend.chat_template.name,
        "model_name": backend.get_model_name(),
        "server_info_keys": sorted(backend.get_server_info()),
    }

    state = year_and_verdict.run(backend=backend, temperature=0)
    results["constrained"] = {
        "year": state["year"],
        "verdict": state["verdict"],
        "verdict_meta": state.get_meta_info("verdict"),
        "color": state["color"],
        "color_meta": state.get_meta_info("color"),
    }

    state = tips.run("sleep", backend=backend, temperature=0)
    results["fork"] = {"tips": state["tip"], "text": state.text()}

    states = tips.run_batch([{"topic": "sleep"}, {"topic": "reading"}], backend=backend, temperature=0)
    results["batch"] = [{"tips": st["tip"], "text": st.text()} for st in states]

    state = streamed.run(backend=backend, temperature=0, stream=True)
    chunks = list(state.text_iter("count"))
    results["stream"] = {"chunks": chunks, "count": state["count"]}

    backend.flush_cache()
    return results


if __name__ == "__main__":
    url = sys.argv[1]
    print(json.dumps(run_seed(url) if "--seed" in sys.argv[2:] else run_all(url), ensure_ascii=False))
