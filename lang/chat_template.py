"""Chat templates of the frontend: the text each role's message is wrapped in, so that a
program's prompt equals what the server's own chat template would render."""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "user", "assistant")


@dataclass(slots=True, frozen=True)
class ChatTemplate:
    """How one model family spells a conversation.

    ``stop`` ends an assistant's generation (the end-of-turn marker); ``default_system_prompt``
    is inserted as a system message when a conversation starts with another role, as the
    model's own template does; ``model_markers`` are substrings of the served model names
    the template is chosen for.
    """

    name: str
    role_prefix: dict[str, str]
    role_suffix: dict[str, str]
    stop: tuple[str, ...] = ()
    default_system_prompt: str | None = None
    model_markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        missing = [role for role in ROLES if role not in self.role_prefix or role not in self.role_suffix]
        if missing:
            raise ValueError(f"chat template {self.name!r} lacks a prefix or suffix for {missing}")


def _chatml(name: str, default_system_prompt: str | None, model_markers: tuple[str, ...]) -> ChatTemplate:
    return ChatTemplate(
        name=name,
        role_prefix={role: f"<|im_start|>{role}\n" for role in ROLES},
        role_suffix={role: "<|im_end|>\n" for role in ROLES},
        stop=("<|im_end|>",),
        default_system_prompt=default_system_prompt,
        model_markers=model_markers,
    )


_TEMPLATES = {
    template.name: template
    for template in (
        _chatml("chatml", None, ()),
        _chatml("smollm2", "You are a helpful AI assistant named SmolLM, trained by Hugging Face", ("smollm",)),
    )
}


def get_chat_template(name: str) -> ChatTemplate:
    """The template registered under ``name``; ValueError listing the known names otherwise."""
    try:
        return _TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(_TEMPLATES)}") from None


def chat_template_for_model(model_name: str) -> ChatTemplate:
    """The template of a served model, matched on its name; plain ChatML when none matches."""
    lowered = model_name.lower()
    for template in _TEMPLATES.values():
        if any(marker in lowered for marker in template.model_markers):
            return template
    return _TEMPLATES["chatml"]
