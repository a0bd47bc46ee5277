"""A reasoning model's thinking, told apart from its answer (``--reasoning-parser``, SGLang's and
vLLM's names): the text between ``<think>`` and ``</think>`` is ``reasoning_content``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixcluster.router.api.text_markers import marker_tail

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    # the chat template opens the thinking itself (DeepSeek-R1's ends its prompt with <think>), so
    # an answer starts inside it, <think> written or not
    opens_in_prompt: bool
    # the chat template's variable whose false turns the thinking off (Qwen3's enable_thinking,
    # whose template then writes an empty thinking into the prompt); None: the model always thinks
    switch: str | None = None

    def thinks(self, template_kwargs: dict[str, Any] | None) -> bool:
        """Whether a chat rendered with ``template_kwargs`` thinks before it answers (SGLang's
        require_reasoning of a chat): its grammar then holds only after ``END``."""
        return self.switch is None or (template_kwargs or {}).get(self.switch) is not False

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """The reasoning and the answer of ``text``. While the text grows (``final`` false), an
        end that may yet become a marker is in neither, and so is an undecided start."""
        body = text.lstrip()
        if not final and START.startswith(body):
            return "", ""  # it may yet open with <think>
        if body.startswith(START):
            body = body[len(START) :]
        elif not self.opens_in_prompt:
            return "", text
        reasoning, ended, answer = body.partition(END)
        if ended:
            return reasoning, answer.lstrip()
        if final:
            return reasoning, ""  # it never ended: all of it is thinking
        return reasoning[: len(reasoning) - marker_tail(reasoning, (END,))], ""

    def written(self, text: str) -> str:
        """The thinking of a finished ``text`` as the model wrote it, its markers included
        ("" when it wrote none)."""
        if not text.lstrip().startswith(START) and not self.opens_in_prompt:
            return ""
        end = text.find(END)
        return text if end < 0 else text[: end + len(END)]


REASONING_FORMATS = {
    "deepseek-r1": ReasoningFormat(opens_in_prompt=True),
    "deepseek_r1": ReasoningFormat(opens_in_prompt=True),
    "qwen3": ReasoningFormat(opens_in_prompt=False, switch="enable_thinking"),
}


def grammar_gate(parser: str | None, template_kwargs: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """``(grammar_after, thinking_start)``, the sampling fields that hold a chat's grammar back while
    its model thinks under the server's reasoning parser, as SGLang holds it back ((None, None): it
    holds from the first token): until ``END``, and where the model writes ``<think>`` itself, only
    if its answer opens with it, as ``split`` reads the answer."""
    if parser is None or not REASONING_FORMATS[parser].thinks(template_kwargs):
        return None, None
    return END, None if REASONING_FORMATS[parser].opens_in_prompt else START
