"""Render a model's Jinja2 chat template the way transformers does, after checking the messages.

A model without a chat template gets ``CHATML_FALLBACK`` (plain ChatML, the format of
SmolLM2, Qwen and many others) rather than an error.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# "developer": OpenAI's newer name for a system message, rendered as one (as SGLang renders it)
# "function": OpenAI's deprecated role of a function's answer, passed to the template as it is (as vLLM does)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# appended to the message a chat continues, to find where the template wrote its end (transformers' way)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

CHATML_FALLBACK = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Jinja's own tojson HTML-escapes; templates expect plain JSON (as in transformers).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    # Templates come with model files: untrusted code, hence the immutable sandbox.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def read_chat_template(value: str | None) -> str | None:
    """The template ``--chat-template`` names: a Jinja file's text, the ``chat_template`` of a
    Hugging Face ``chat_template.json``, or ``value`` itself when it is a template (vLLM takes
    both); None without the flag. ValueError saying why when it is none of them, or does not
    compile."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--chat-template {value}: cannot read it: {exc}") from exc
    elif _is_jinja(value):
        text = value
    else:
        raise ValueError(
            f"--chat-template {value!r}: no such file, nor a Jinja template; give a template's file "
            "(SGLang's built-in template names are not kept here: the model's own template is the default)"
        )
    named = value if text is not value else f"{value:.80}"  # a file by its path, a template by its start
    try:
        template = _template_in(text)
    except ValueError as exc:
        raise ValueError(f"--chat-template {named}: {exc}") from None
    try:
        _compile(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template {named}: line {exc.lineno}: {exc.message}") from exc
    return template


def _is_jinja(text: str) -> bool:
    return "{{" in text or "{%" in text


def _template_in(text: str) -> str:
    """The Jinja template ``text`` is, or, as JSON, holds: Hugging Face's ``chat_template`` (a
    string, or named templates, of which transformers takes the one named "default"). Other JSON,
    and text with no Jinja in it, would render every chat as that same text, so they are refused,
    SGLang's JSON conversation templates by name."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and "sep_style" in data:
        raise ValueError(
            "SGLang's JSON conversation templates (sep_style) are not supported; "
            "give a Jinja chat template (a .jinja file, or the template itself)"
        )
    if isinstance(data, (dict, list)):
        named = data.get("chat_template") if isinstance(data, dict) else data
        if isinstance(named, list):
            named = next((t.get("template") for t in named if isinstance(t, dict) and t.get("name") == "default"), None)
        if not isinstance(named, str):
            raise ValueError(
                'JSON that holds no chat template: Hugging Face\'s is {"chat_template": "..."}, '
                'or a list of {"name", "template"} of which one is named "default"'
            )
        text = named
    if not _is_jinja(text):
        raise ValueError("it holds no Jinja ({{ }} or {% %}): every chat would be rendered as this same text")
    return text


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Copies of the messages with text-part lists joined into one string.

    Raises ValueError (the api's 400) naming the bad message: not a non-empty list of
    dicts, a role outside ``ROLES``, or content that is neither a
    string nor a list of ``{"type": "text", "text": ...}`` parts. An assistant message
    carrying ``tool_calls`` may have no content; a developer message becomes a system one.
    """
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{index}] must be an object with role and content, got {type(message).__name__}")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{index}].role must be one of {sorted(ROLES)}, got {role!r}")
        content = message.get("content")
        if content is None and role == "assistant" and message.get("tool_calls"):
            content = ""
        role = "system" if role == "developer" else role
        checked.append({**message, "role": role, "content": _content_text(content, index)})
    return checked


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ValueError(
                    f'messages[{index}].content[{part_index}] must be a text part {{"type": "text", "text": "..."}}; '
                    f"got {part!r:.80}"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ValueError(
        f"messages[{index}].content must be a string or a list of text parts, got {type(content).__name__}"
    )


def render_chat_template(
    template: str | None,
    messages: Any,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    special_tokens: dict[str, str | None] | None = None,
    continue_final_message: bool = False,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text for ``messages`` (validated first, see ``validate_messages``).

    ``special_tokens`` supplies the template variables ``bos_token``, ``eos_token`` etc.
    ``continue_final_message``: the text ends inside the last message (no end of turn, no
    generation prompt), so the model goes on with it, cut where transformers cuts it.
    ``template_kwargs`` are the template's own variables (a request's ``chat_template_kwargs``);
    they may not stand for any of the above or the template's functions. A template that calls
    ``raise_exception`` (e.g. on roles it does not accept), or fails on the values of
    ``template_kwargs``, raises ValueError with its message.
    """
    checked = validate_messages(messages)
    compiled = _compile(template or CHATML_FALLBACK)  # a broken model template is our fault, not the client's
    given = template_kwargs or {}
    taken = sorted(
        given.keys() & {*(special_tokens or {}), *compiled.globals, "messages", "tools", "add_generation_prompt"}
    )
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(taken)}: the server sets them")
    if continue_final_message:
        checked[-1]["content"] += _CONTINUE_TAG
    try:
        text = compiled.render(
            **given,
            messages=checked,
            tools=tools,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            **(special_tokens or {}),
        )
    except jinja2.exceptions.TemplateError as exc:
        raise ValueError(f"the chat template rejected the messages: {exc}") from exc
    except Exception as exc:
        if not given:
            raise
        # a client's value of a type the template does not expect (a dict where it adds strings)
        raise ValueError(f"the chat template failed on chat_template_kwargs: {type(exc).__name__}: {exc}") from exc
    if not continue_final_message:
        return text
    end = text.rfind(_CONTINUE_TAG.strip())
    if end < 0:
        raise ValueError("the chat template does not write the last message as given, so it cannot be continued")
    # a template that trims the message's end trimmed the tag's space too: trim what it would have
    return text[:end] if text.startswith(_CONTINUE_TAG, end) else text[:end].rstrip()
