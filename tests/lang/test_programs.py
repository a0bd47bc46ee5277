"""Programs against a real server: the seed's multi-round chat, fork, select, run_batch, errors."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import requests

import radixcluster.lang as sgl

pytestmark = pytest.mark.slow

TIMEOUT_S = 300


def metric(server, name: str) -> float:
    for line in requests.get(f"{server.url}/metrics", timeout=TIMEOUT_S).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@sgl.function
def multi_round_chat(s):
    # The seed's program (shared/seeds/003, section 4.2) with short answers.
    s += sgl.system("你是一个AI助手，回答要准确简洁。")
    s += sgl.user("介绍一下Transformer架构")
    s += sgl.assistant(sgl.gen("answer1", max_tokens=12))
    s += sgl.user("它和RNN有什么区别？")
    s += sgl.assistant(sgl.gen("answer2", max_tokens=12))
    s += sgl.user("能画个结构图吗？")
    s += sgl.assistant(sgl.gen("answer3", max_tokens=8))


def test_multi_round_chat_reuses_each_earlier_round(server, backend, tokenizer):
    prompt_before, cached_before = (
        metric(server, "radixcluster_prompt_tokens_total"),
        metric(server, "radixcluster_cached_tokens_total"),
    )
    state = multi_round_chat.run(backend=backend)
    metas = [state.get_meta_info(f"answer{i}") for i in (1, 2, 3)]
    assert all(state[f"answer{i}"] for i in (1, 2, 3))
    for earlier, later in zip(metas, metas[1:]):
        assert later["cached_tokens"] >= 0.9 * (earlier["prompt_tokens"] + earlier["completion_tokens"])
    info = state.get_cache_hit_info()
    assert info["total_tokens"] == sum(m["prompt_tokens"] for m in metas)
    assert info["cached_tokens"] == sum(m["cached_tokens"] for m in metas)
    assert info["hit_rate"] == info["cached_tokens"] / info["total_tokens"]
    assert metric(server, "radixcluster_prompt_tokens_total") - prompt_before == info["total_tokens"]
    assert metric(server, "radixcluster_cached_tokens_total") - cached_before == info["cached_tokens"]
    # The prompt the server saw is the model's own chat template applied to the conversation.
    assert state.text() == tokenizer.apply_chat_template(state.messages(), add_generation_prompt=False)


@sgl.function
def branches(s, context, n):
    s += context
    forks = s.fork(n)
    for i, f in enumerate(forks):
        f += f"\nIdea {i + 1}:" + sgl.gen("idea", max_tokens=4, temperature=0)
    forks.join()


def test_fork_branches_all_hit_the_shared_prefix(backend, tokenizer):
    context = "".join(f"A shared context for forked branches, sentence number {i}. " for i in range(40)) + "Tag: fork."
    prefix_tokens = len(tokenizer.encode(context, add_special_tokens=False))
    state = branches.run(context, 4, backend=backend)
    ideas = state["idea"]
    assert len(ideas) == 4
    for meta in state.get_meta_info("idea")["forks"]:
        assert meta["cached_tokens"] >= prefix_tokens - 2


@sgl.function
def yes_no(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.select("answer", choices=["Yes", "No", "Maybe not"]))


def _normalized_logprob(server, tokenizer, prefix: str, choice: str) -> float:
    """SGLang's token-length-normalized logprob of a choice, from the whole text scored from
    position 0: the mean over the prefix's last token and what follows it (SGLang asks from
    two tokens before the choice, and the first entry of an answer has no logprob)."""
    prompt_len = len(tokenizer.encode(prefix, add_special_tokens=False))
    body = {
        "text": prefix + choice,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    entries = requests.post(f"{server.url}/generate", json=body, timeout=TIMEOUT_S).json()["meta_info"][
        "input_token_logprobs"
    ]
    values = [entry[0] for entry in entries[prompt_len - 1 :]]
    return sum(values) / len(values)


def test_select_picks_the_highest_normalized_logprob(server, backend, tokenizer):
    state = yes_no.run("Is the sky blue? Answer yes or no.", backend=backend)
    meta = state.get_meta_info("answer")
    prefix = state.text()[: -len(state["answer"]) - len("<|im_end|>\n")]
    expected = [_normalized_logprob(server, tokenizer, prefix, choice) for choice in meta["choices"]]
    assert meta["normalized_prompt_logprobs"] == pytest.approx(expected, abs=1e-3)
    assert state["answer"] == meta["choices"][max(range(len(expected)), key=expected.__getitem__)]
    assert state.messages()[-1] == {"role": "assistant", "content": state["answer"]}


@sgl.function
def yes_no_by(s, question, method):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", choices=["Yes", "No", "Maybe not"], choices_method=method))


def test_select_by_greedy_tokens_and_by_unconditional_likelihood(backend, server):
    question = "Is the sky blue? Answer yes or no."
    greedy = yes_no_by.run(question, sgl.greedy_token_selection, backend=backend).get_meta_info("answer")
    rows = [[entry[0] for entry in entries[1:]] for entries in greedy["input_token_logprobs"]]
    assert [row[: len(r)] for row, r in zip(greedy["greedy_logprob_matrix"], rows)] == rows
    state = yes_no_by.run(question, sgl.unconditional_likelihood_normalized, backend=backend)
    meta = state.get_meta_info("answer")
    # each choice's tokens scored again with nothing before them, as a client would ask
    for entries, alone in zip(meta["input_token_logprobs"], meta["unconditional_token_logprobs"]):
        body = {"input_ids": [entry[1] for entry in entries], "sampling_params": {"max_new_tokens": 0}}
        again = requests.post(
            f"{server.url}/generate", json={**body, "return_logprob": True, "logprob_start_len": 0}, timeout=TIMEOUT_S
        ).json()["meta_info"]["input_token_logprobs"]
        assert [entry[1] for entry in alone] == [entry[1] for entry in again] and alone[0][0] is again[0][0] is None
        assert [entry[0] for entry in alone[1:]] == pytest.approx([entry[0] for entry in again[1:]], abs=1e-4)
    gains = meta["normalized_unconditional_prompt_logprobs"]
    assert state["answer"] == meta["choices"][max(range(3), key=gains.__getitem__)]


@sgl.function
def scoped(s):
    s += "Q: name a color.\n"
    with s.var_scope("answer"):
        s += "A:" + sgl.gen("color", max_tokens=3, temperature=0)
    with s.copy() as aside:
        aside += " Another:" + sgl.gen("other", max_tokens=3, temperature=0)


def test_var_scope_holds_the_blocks_text_and_a_copy_is_joined_back(backend):
    state = scoped.run(backend=backend)
    assert state["answer"] == "A:" + state["color"] and state.text() == "Q: name a color.\n" + state["answer"]
    # as SGLang's copy: one fork, its variables gathered into the parent as lists
    assert isinstance(state["other"], list) and len(state["other"]) == 1 and state["other"][0]


@sgl.function
def arithmetic(s, a, b):
    s += f"Question: what is {a} plus {b}?\nAnswer:" + sgl.gen("answer", max_tokens=4, temperature=0)


def test_run_batch_returns_states_in_input_order(backend):
    batch = [{"a": i, "b": 10 * i} for i in range(6)]
    states = arithmetic.run_batch(batch, backend=backend, num_threads=3)
    assert len(states) == len(batch)
    for kwargs, state in zip(batch, states):
        assert state.text() == f"Question: what is {kwargs['a']} plus {kwargs['b']}?\nAnswer:{state['answer']}"
        assert state.get_meta_info("answer")["completion_tokens"] >= 1


def test_a_failed_program_in_a_batch_keeps_its_error_and_loses_no_other_result(backend):
    """As SGLang's run_batch: every state comes back, the failed one holding its error."""
    batch = [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"a": 5, "b": 6}]
    states = arithmetic.run_batch(batch, backend=backend, temperature=0, top_k=0)  # top_k 0: a 400
    assert all(isinstance(state.error(), sgl.ServerError) for state in states)
    mixed = [*batch, {"a": "x", "b": 1, "top_k": 0}]
    *good, bad = arithmetic.run_batch(mixed, backend=backend)
    assert [state.error() for state in good] == [None] * 3 and all(state["answer"] for state in good)
    assert isinstance(bad.error(), sgl.ServerError) and bad.error().status == 400
    with pytest.raises(sgl.ServerError):
        bad.text()
    streamed = arithmetic.run_batch(batch, backend=backend, generator_style=True)
    assert not isinstance(streamed, list) and [s["answer"] for s in streamed] == [s["answer"] for s in good]


@sgl.function
def sglang_spellings(s):
    """SGLang's other spellings of the same program: role contexts, variables set by hand,
    a fork's per-branch appends (a list, or a function of the branch)."""
    with s.system():
        s += "Answer in one word."
    with s.user():
        s += "  Name a colour."
    s.assistant(sgl.gen("colour", max_tokens=3))
    s["tag"] = "set by hand"
    forks = s.fork(2)
    forks += [" Red:", " Blue:"]
    forks += lambda i: sgl.gen("word", max_tokens=2, stop=str(i))
    forks.join()


def test_sglangs_other_spellings_run_as_sglangs_frontend_runs_them(backend):
    state = sglang_spellings(backend=backend, temperature=0)  # calling a program runs it
    plain = sgl.function(
        lambda s: [
            s.__iadd__(sgl.system("Answer in one word.")),
            s.__iadd__(sgl.user("  Name a colour.")),
            s.__iadd__(sgl.assistant(sgl.gen("colour", max_tokens=3))),
        ]
    ).run(backend=backend, temperature=0)
    assert state["colour"] == plain["colour"]
    assert state.messages()[:2] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a colour."},  # SGLang lists a message without its leading space
    ]
    assert state.get_var("tag") == "set by hand" and "tag" in state and "nothing" not in state
    assert len(state["word"]) == 2 and state.fork(1)  # a fork of one branch by default


def test_an_empty_choice_is_scored_too(backend):
    @sgl.function
    def negation(s):
        s += "The sky is" + sgl.select("neg", choices=["", " not"]) + " blue."

    state = negation.run(backend=backend)
    assert state["neg"] in ("", " not") and len(state.get_meta_info("neg")["normalized_prompt_logprobs"]) == 2


def test_server_error_surfaces_with_its_message(backend):
    @sgl.function
    def bad(s):
        s += "Hello" + sgl.gen("x", max_tokens=2, top_k=0)

    with pytest.raises(sgl.ServerError, match="top_k") as caught:
        bad.run(backend=backend)
    assert caught.value.status == 400


def test_reading_a_missing_variable_names_the_known_ones(backend):
    @sgl.function
    def one(s):
        s += "Count: 1, 2," + sgl.gen("next", max_tokens=2, temperature=0)

    state = one.run(backend=backend)
    with pytest.raises(KeyError, match="next"):
        state["nxt"]


def test_json_schema_gen_follows_the_schema(backend):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }

    @sgl.function
    def extract(s):
        s += sgl.user("Alice is 31 years old. Give her name and age as JSON.")
        s += sgl.assistant(sgl.gen("person", max_tokens=32, temperature=0, json_schema=schema))

    state = extract.run(backend=backend)
    jsonschema.validate(json.loads(state["person"]), schema)


def test_gen_int_and_gen_string_answer_in_their_type(backend):
    @sgl.function
    def typed(s):
        s += "Question: how many legs does a spider have?\nAnswer (a number): " + sgl.gen_int("legs", max_tokens=6)
        s += "\nIts name, quoted: " + sgl.gen_string("name", max_tokens=12, temperature=0)

    state = typed.run(backend=backend, temperature=0)
    assert int(state["legs"]) >= 0  # digits only: the number regex, cut at its space or newline
    assert re.fullmatch(r'"[\w\d\s]*"', state["name"])
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)


def test_flush_cache_and_server_info_through_the_module(server, backend):
    prompt = "Flush me: " + "a b c " * 20
    sgl.set_default_backend(backend)
    try:
        assert sgl.get_server_info()["model_path"] == backend.get_server_info()["model_path"]
        requests.post(
            f"{server.url}/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 1}}, timeout=TIMEOUT_S
        )
        assert sgl.flush_cache()["success"] is True
    finally:
        sgl.set_default_backend(None)
    again = requests.post(
        f"{server.url}/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 1}}, timeout=TIMEOUT_S
    )
    assert again.json()["meta_info"]["cached_tokens"] == 0
