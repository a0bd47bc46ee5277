"""A chat template that writes tools, tool calls and an assistant's earlier thinking
(``reasoning_content``), and reads a variable of its own as Qwen 3's reads ``enable_thinking``:
for tests of what reaches templates (SmolLM2's uses none of these)."""

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n"
    "{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}{{ message.content }}"
    "{% for call in message.tool_calls or [] %}<tool_call>{{ call.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
