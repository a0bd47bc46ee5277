"""run()'s keywords against a real server: SGLang's sampling defaults for every gen (a gen's
own parameters win), the logprob fields, and the same for run_batch."""

from __future__ import annotations

import pytest

import radixcluster.lang as sgl

pytestmark = pytest.mark.slow

QUESTION = "Question: name three colours.\nAnswer:"


@sgl.function
def answer(s, question):
    s += question + sgl.gen("plain") + "\nAgain:" + sgl.gen("capped", max_tokens=3)


def test_run_keywords_are_every_gens_defaults_and_a_gens_own_win(backend):
    state = answer.run(QUESTION, backend=backend, temperature=0, max_new_tokens=6, ignore_eos=True)
    assert state.get_meta_info("plain")["completion_tokens"] == 6
    assert state.get_meta_info("capped")["completion_tokens"] == 3  # the gen's max_tokens over the run's
    # greedy, as the run asked: the same program with the same defaults answers the same
    again = answer.run(question=QUESTION, backend=backend, temperature=0, max_new_tokens=6, ignore_eos=True)
    assert again.text() == state.text()


def test_run_stop_and_logprob_fields_reach_each_gen(backend):
    @sgl.function
    def count(s):
        s += "1, 2, 3, 4," + sgl.gen("rest", max_tokens=20)

    state = count.run(backend=backend, temperature=0, stop=" 7", return_logprob=True, top_logprobs_num=2)
    meta = state.get_meta_info("rest")
    assert state["rest"] == " 5, 6," and meta["finish_reason"]["matched"] == " 7"
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(tops) == 2 for tops in meta["output_top_logprobs"])


def test_gen_takes_sglangs_logprob_and_stop_regex_parameters(backend):
    @sgl.function
    def count(s):
        s += "1, 2, 3, 4," + sgl.gen(
            "rest", max_tokens=20, temperature=0, stop_regex=r" 7\b", return_logprob=True, return_text_in_logprobs=True
        )

    state = count.run(backend=backend)
    meta = state.get_meta_info("rest")
    assert state["rest"] == " 5, 6, 7" and meta["finish_reason"]["type"] == "stop"  # a regex's match stays
    assert "".join(text for _, _, text in meta["output_token_logprobs"]) == " 5, 6, 7"


def test_run_batch_passes_the_defaults_to_every_run(backend):
    states = answer.run_batch(
        [{"question": QUESTION}, {"question": "Question: name two fruits.\nAnswer:"}],
        backend=backend,
        num_threads="auto",
        temperature=0,
        max_new_tokens=4,
        ignore_eos=True,
    )
    assert [s.get_meta_info("plain")["completion_tokens"] for s in states] == [4, 4]
    assert (
        states[0].text()
        == answer.run(QUESTION, backend=backend, temperature=0, max_new_tokens=4, ignore_eos=True).text()
    )
    with pytest.raises(ValueError, match="num_threads"):
        answer.run_batch([{"question": QUESTION}], backend=backend, num_threads=0)


@pytest.mark.parametrize("program", [lambda question: None, lambda: None, lambda *, s: None])
def test_a_program_whose_first_argument_is_not_the_state_is_refused_where_it_is_defined(program):
    """As SGLang refuses it: the state comes first, so any other first parameter would take it."""
    with pytest.raises(TypeError, match='must be the state "s"'):
        sgl.function(program)
