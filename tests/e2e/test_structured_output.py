"""Constrained decoding against a real `radixcluster up`: sampled generations under a JSON
schema, regexes, an EBNF grammar and structural tags all conform; the OpenAI SDK's response_format works; a bad
grammar is a 400 that says what is wrong, and the server keeps serving."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import openai
import pytest
import requests

from support.api_helpers import assert_error, generate, post

pytestmark = pytest.mark.slow

# short strings and a short array: every document, pretty-printed too, fits well inside max_new_tokens
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 10},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "editor", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 2},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
PROMPT = "Here is one user record of our web shop, as JSON:\n"
REGEXES = {
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "date": r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "word": r"(apple|banana|cherry)( and (apple|banana|cherry))?",
}


def sampled_batch(server, text: str, count: int, max_new_tokens: int, **grammar) -> list[dict]:
    """``count`` generations of ``text`` at temperature 0.9, each with its own seed, in one request."""
    params = [{"temperature": 0.9, "seed": seed, "max_new_tokens": max_new_tokens, **grammar} for seed in range(count)]
    # the whole batch answers at once: on a loaded CPU that takes minutes
    resp = requests.post(
        server.url + "/generate",
        json={"text": [text] * count, "sampling_params": params},
        headers=server.headers(),
        timeout=900,
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_thirty_two_sampled_generations_follow_the_json_schema(server):
    outs = sampled_batch(server, PROMPT, 32, 256, json_schema=json.dumps(PERSON))
    texts = [o["text"] for o in outs]
    for out in outs:
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        jsonschema.validate(json.loads(out["text"]), PERSON)
    assert len(set(texts)) > 10  # sampled, not one answer 32 times


@pytest.mark.parametrize("name", REGEXES)
def test_regex_outputs_match_in_full(server, name):
    pattern = REGEXES[name]
    for out in sampled_batch(server, f"Write a {name}: ", 8, 40, regex=pattern):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        assert re.fullmatch(pattern, out["text"]), out["text"]


def test_ebnf_outputs_are_sentences_of_the_grammar(server):
    grammar = 'root ::= animal " says " sound "."\nanimal ::= "The cat" | "The dog" | "A cow"\nsound ::= "meow" | "woof" | "moo"'
    for out in sampled_batch(server, "A sentence: ", 8, 30, ebnf=grammar):
        assert re.fullmatch(r"(The cat|The dog|A cow) says (meow|woof|moo)\.", out["text"]), out["text"]


def test_greedy_constrained_streaming_equals_the_whole_answer(server):
    params = {"temperature": 0, "max_new_tokens": 40, "regex": REGEXES["date"]}
    whole = generate(server, "The date today is ", sampling_params=params)["text"]
    resp = post(
        server, "/generate", {"text": "The date today is ", "sampling_params": params, "stream": True}, stream=True
    )
    chunks = [json.loads(line[6:]) for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: {")]
    assert chunks[-1]["text"] == whole and re.fullmatch(REGEXES["date"], whole)


def test_openai_json_object_and_json_schema_response_formats(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Describe a user of a web shop as JSON."}]
    resp = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=128,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), PERSON)
    loose = client.chat.completions.create(
        model=model, messages=messages, max_tokens=64, temperature=0, response_format={"type": "json_object"}
    )
    # an object with any keys may run past max_tokens; what is there is an object's beginning
    assert loose.choices[0].message.content.startswith("{")


def test_a_completion_takes_response_format_too(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}, "required": ["name"]}

    def complete(**format_):  # SGLang and vLLM read response_format on completions as on chats
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=64, temperature=0, extra_body=format_)

    plain = complete().choices[0].text
    assert not plain.startswith("{")  # left alone, the model opens a code fence first
    shaped = complete(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    assert shaped.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(shaped.choices[0].text), schema)
    assert complete(response_format={"type": "json_object"}).choices[0].text.startswith("{")


def test_vllms_structured_outputs_and_stop_string_flag(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    question = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]

    def answer(**extra) -> str:
        resp = client.chat.completions.create(
            model=model, messages=question, max_tokens=48, temperature=0, extra_body=extra
        )
        return resp.choices[0].message.content

    assert answer(structured_outputs={"choice": ["Yes", "No", "Maybe so"]}) in ("Yes", "No", "Maybe so")
    assert re.fullmatch(r"(yes|no)\.", answer(structured_outputs={"regex": r"(yes|no)\."}))
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    assert re.fullmatch(r"The answer is (yes|no)\.", answer(structured_outputs={"grammar": grammar}))
    schema = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]}
    jsonschema.validate(json.loads(answer(structured_outputs={"json": schema})), schema)
    trimmed, kept = answer(stop=["."]), answer(stop=["."], include_stop_str_in_output=True)
    assert kept == trimmed + "."


CALL = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}
CALLS = 'Example call: <function=get_weather>{"city": "Oslo"}</function>\nExample call: <function=get_weather>{"city": "Lima"}</function>\nExample call:'


def test_sglangs_structural_tag_constrains_what_follows_a_trigger(server):
    """SGLang's documented form: free text, then after a trigger a tag whose JSON follows its schema."""
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<function=get_weather>", "schema": CALL, "end": "</function>"}],
        "triggers": ["<function="],
    }
    free = generate(server, CALLS, max_new_tokens=40)["text"]
    assert free.startswith(' <function=get_weather>{"city": "Lima"}')  # the model's own next call
    text = generate(server, CALLS, max_new_tokens=40, sampling_params={"structural_tag": json.dumps(tag)})["text"]
    calls = re.findall(r"<function=get_weather>(.*?)</function>", text)
    assert calls and text.startswith(" <function=get_weather>")
    for arguments in calls:
        jsonschema.validate(json.loads(arguments), CALL)


def test_a_structural_tag_as_response_format_and_as_vllms_structured_outputs(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    # xgrammar's own form: here one tag and nothing around it
    tag = {
        "type": "tag",
        "begin": "<weather>",
        "content": {"type": "json_schema", "json_schema": CALL},
        "end": "</weather>",
    }
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    answers = [
        client.chat.completions.create(model=model, messages=question, max_tokens=40, temperature=0, **format_)
        for format_ in (
            {"response_format": {"type": "structural_tag", "format": tag}},
            {"extra_body": {"structured_outputs": {"structural_tag": json.dumps({"format": tag})}}},
        )
    ]
    for answer in answers:
        content = answer.choices[0].message.content
        assert answer.choices[0].finish_reason == "stop"
        assert content.startswith("<weather>") and content.endswith("</weather>")
        jsonschema.validate(json.loads(content.removeprefix("<weather>").removesuffix("</weather>")), CALL)


def test_logprobs_under_a_grammar_are_those_of_what_it_allows(server):
    """As SGLang and vLLM give them: a confidence over the choices, not over the free text."""
    body = {
        "model": "any",
        "messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 20,
        "structured_outputs": {"choice": ["yes", "no"]},
    }
    first, *_ = post(server, "/v1/chat/completions", body).json()["choices"][0]["logprobs"]["content"]
    top = {entry["token"]: entry["logprob"] for entry in first["top_logprobs"]}
    allowed = [logprob for logprob in top.values() if logprob > -9999]
    # the choices' first tokens (y, ye, yes, n, no at most) share the whole probability
    assert 1 <= len(allowed) <= 5 and math.isclose(sum(math.exp(v) for v in allowed), 1.0, rel_tol=1e-3)
    assert min(top.values()) == -9999.0 and first["logprob"] == max(top.values())


BAD_GRAMMARS = {
    "unclosed regex group": ({"regex": "(ab"}, ["invalid regex", "parenthesis"]),
    "json_schema not JSON": ({"json_schema": '{"type": "object"'}, ["invalid json_schema", "parse JSON"]),
    "json_schema of a wrong type": ({"json_schema": '{"type": 5}'}, ["invalid json_schema", "type"]),
    "json_schema that is a list": ({"json_schema": "[1, 2]"}, ["invalid json_schema", "object"]),
    "broken ebnf": ({"ebnf": 'root ::= "a'}, ["invalid ebnf", "string literal"]),
    "ebnf without root": ({"ebnf": 'start ::= "a"'}, ["invalid ebnf", "root"]),
    "json_schema with uniqueItems": (
        {"json_schema": '{"type": "array", "items": {"enum": ["a"]}, "minItems": 2, "uniqueItems": true}'},
        ["invalid json_schema", "'uniqueItems'"],
    ),
    "structural_tag of an unknown format": (
        {"structural_tag": '{"type": "structural_tag", "format": {"type": "tagz"}}'},
        ["invalid structural_tag", "tagz"],
    ),
    "structural_tag without triggers": (
        {"structural_tag": {"structures": [{"begin": "<a>", "end": "</a>"}]}},
        ["structural_tag", "no triggers"],
    ),
}


@pytest.mark.parametrize("grammar,words", BAD_GRAMMARS.values(), ids=BAD_GRAMMARS.keys())
def test_a_bad_grammar_is_a_400_that_says_why(server, grammar, words):
    resp = post(server, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 4, **grammar}})
    assert_error(resp, 400, *words)
    assert generate(server, "Hi", max_new_tokens=2)["meta_info"]["completion_tokens"] <= 2


def test_a_bad_schema_through_openai_is_a_400(server):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}},
        },
    }
    assert_error(post(server, "/v1/chat/completions", body), 400, "invalid json_schema", "properties")
