"""Role blocks render exactly what the model's own chat template (the server's) renders."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import radixcluster.lang as sgl
from radixcluster.lang.chat_template import chat_template_for_model

# Roles and text only make no request: the backend is never contacted.
OFFLINE = sgl.RuntimeEndpoint("http://127.0.0.1:9", chat_template="smollm2")

ROLE_OF = {"system": sgl.system, "user": sgl.user, "assistant": sgl.assistant}


@sgl.function
def conversation(s, turns):
    for role, content in turns:
        s += ROLE_OF[role](content)


content_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40).filter(lambda t: "<|im_" not in t)
turns = st.lists(st.tuples(st.sampled_from(["user", "assistant"]), content_text), min_size=1, max_size=5)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system=st.one_of(st.none(), content_text), turns=turns)
def test_rendering_equals_the_model_template(tokenizer, system, turns):
    all_turns = ([("system", system)] if system is not None else []) + turns
    state = conversation.run(all_turns, backend=OFFLINE)
    messages = [{"role": role, "content": content} for role, content in all_turns]
    assert state.text() == tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert state.text() + OFFLINE.chat_template.role_prefix["assistant"] == rendered


def test_default_system_prompt_is_a_message():
    state = conversation.run([("user", "hi")], backend=OFFLINE)
    assert state.messages() == [
        {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"role": "user", "content": "hi"},
    ]


def test_template_chosen_from_model_name():
    assert chat_template_for_model("SmolLM2-135M-Instruct").name == "smollm2"
    assert chat_template_for_model("Qwen2-7B-Instruct").name == "chatml"
    assert chat_template_for_model("Qwen2-7B-Instruct").default_system_prompt is None


@sgl.function
def conversation_by_marks(s, turns):
    # the same conversation, each message opened and closed around appends of its parts
    for role, content in turns:
        s += getattr(sgl, f"{role}_begin")()
        s += content[: len(content) // 2]
        s += content[len(content) // 2 :]
        s += getattr(sgl, f"{role}_end")()


@settings(max_examples=50, deadline=None)
@given(turns=turns)
def test_begin_and_end_marks_render_as_whole_role_blocks(turns):
    whole = conversation.run(turns, backend=OFFLINE)
    marked = conversation_by_marks.run(turns, backend=OFFLINE)
    assert marked.text() == whole.text() and marked.messages() == whole.messages()


@pytest.mark.parametrize(
    "marks, fragment",
    [
        ((sgl.user_end(),), "user_end\\(\\) with no message open"),
        ((sgl.user_begin(), sgl.assistant_end()), "assistant_end\\(\\) inside the user message"),
        ((sgl.user_begin(), sgl.system_begin()), "cannot start inside"),
    ],
)
def test_unmatched_marks_are_refused(marks, fragment):
    @sgl.function
    def program(s):
        for mark in marks:
            s += mark

    with pytest.raises(ValueError, match=fragment):
        program.run(backend=OFFLINE)


def test_nested_roles_are_refused():
    @sgl.function
    def nested(s):
        s += sgl.user(sgl.assistant("x"))

    with pytest.raises(ValueError, match="cannot start inside"):
        nested.run(backend=OFFLINE)


def test_unknown_template_name_lists_known_ones():
    with pytest.raises(ValueError, match="chatml"):
        sgl.get_chat_template("vicuna")


def test_sglangs_chat_template_name_keyword_names_a_template():
    endpoint = sgl.RuntimeEndpoint("http://127.0.0.1:9", chat_template_name="chatml")
    assert endpoint.chat_template.name == "chatml"
    with pytest.raises(ValueError, match="not both"):
        sgl.RuntimeEndpoint("http://127.0.0.1:9", chat_template="chatml", chat_template_name="chatml")
