"""A prompt's text as the model sees it, from a plain text or a chat: the one rule the router
(which tokenizes what it serves) and the gateway (which tokenizes to predict the router's
cache hits) must share."""

from __future__ import annotations

from typing import Any

from radixcluster.router.text.tokenizer import Tokenizer


def prompt_text(
    tokenizer: Tokenizer,
    text: str | None,
    messages: list[dict[str, Any]] | None,
    continue_final_message: bool,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
) -> tuple[str, bool]:
    """The text to encode and whether the model's BOS is added: a chat is rendered with the
    model's template (given its ``tools`` and the template's own variables), which writes its
    own special tokens, to the generation prompt or (``continue_final_message``) into its last
    message. ValueError on malformed messages."""
    if messages is not None:
        return tokenizer.apply_chat_template(messages, True, tools, continue_final_message, template_kwargs), False
    if text is None:
        raise ValueError("one of text or messages is required")
    return text, True
