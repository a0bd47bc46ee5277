"""JSON out of the api: UTF-8 as Starlette writes it, and a lone surrogate that a model's tool
call spelled with an escape goes out escaped (it failed the answer with a 500)."""

from __future__ import annotations

import json

from radixcluster.router.api.generation import sse
from radixcluster.router.api.json_text import JsonResponse, utf8_json
from radixcluster.router.api.messages_output import MessageView
from radixcluster.router.api.tool_calls import ChatToolCalls


def test_text_is_utf8_as_starlette_writes_it():
    value = {"text": "café ☕ 東京", "n": [1, 2.5]}
    assert utf8_json(value) == json.dumps(value, ensure_ascii=False).encode()
    assert JsonResponse(value).body == '{"text":"café ☕ 東京","n":[1,2.5]}'.encode()


def test_a_lone_surrogate_from_a_models_tool_call_goes_out_escaped():
    # the model wrote a JSON escape of a lone surrogate inside a forced call's parameters
    answer = '[{"name": "f", "parameters": {"a": "\\ud800 é"}}]'
    _, calls = ChatToolCalls("required").answer(answer)
    arguments = calls[0]["function"]["arguments"]
    for body in (JsonResponse({"tool_calls": calls}).body, sse({"tool_calls": calls})[len(b"data: ") :]):
        assert json.loads(body)["tool_calls"][0]["function"]["arguments"] == arguments
    assert json.loads(arguments) == {"a": "\ud800 é"}
    tool_use = MessageView.tool_use(calls[0])  # Anthropic's input is the parsed object
    assert json.loads(JsonResponse(tool_use).body)["input"] == {"a": "\ud800 é"}
