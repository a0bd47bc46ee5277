"""A streamed run (`run(stream=True)`) against a real server: text_iter yields the program's text,
or one variable's, in pieces as the server streams them, and the whole state stays readable."""

from __future__ import annotations

import pytest

import radixcluster.lang as sgl

pytestmark = pytest.mark.slow


@sgl.function
def two_turns(s, question):
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("first", max_tokens=12, ignore_eos=True))
    s += sgl.user("And in one word?")
    s += sgl.assistant(sgl.gen("second", max_tokens=6, ignore_eos=True))


def test_text_iter_streams_the_whole_program(backend):
    state = two_turns.run("What is a radix tree?", backend=backend, temperature=0, stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 12  # the gens arrive token by token, not whole
    assert "".join(pieces) == state.text()
    plain = two_turns.run("What is a radix tree?", backend=backend, temperature=0)
    assert state.text() == plain.text() and state["second"] == plain["second"]
    assert state.get_meta_info("first")["completion_tokens"] == 12


def test_text_iter_of_a_variable_ends_with_its_gen(backend):
    state = two_turns.run("Name a colour.", backend=backend, temperature=0, stream=True)
    first = list(state.text_iter("first"))
    assert len(first) > 1 and "".join(first) == state["first"]
    assert "".join(state.text_iter("second")) == state["second"]
    assert list(state.text_iter("never")) == []  # a variable the program never sets: nothing, at its end


def test_without_stream_text_iter_gives_the_text_once(backend):
    state = two_turns.run("Name a colour.", backend=backend, temperature=0, max_new_tokens=4)
    assert list(state.text_iter()) == [state.text()]
    assert list(state.text_iter("second")) == [state["second"]]


def test_a_streamed_runs_server_error_raises_from_text_iter(backend):
    @sgl.function
    def bad(s):
        s += "Hello" + sgl.gen("x", max_tokens=4) + sgl.gen("y", max_tokens=2, top_k=0)

    state = bad.run(backend=backend, stream=True)
    with pytest.raises(sgl.ServerError, match="top_k") as caught:
        list(state.text_iter())
    assert caught.value.status == 400
    with pytest.raises(sgl.ServerError):
        state.text()


def test_a_program_that_raises_raises_from_the_streamed_state(backend):
    @sgl.function
    def broken(s):
        s += "Hello" + sgl.gen("x", max_tokens=2)
        raise RuntimeError("the program's own bug")

    state = broken.run(backend=backend, stream=True)
    with pytest.raises(RuntimeError, match="own bug"):
        list(state.text_iter())
