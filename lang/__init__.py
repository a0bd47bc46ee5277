"""radixcluster.lang: a frontend language for LLM programs (roles, gen, select, fork) whose calls share prefixes through the radix cache."""

from radixcluster.lang.backend import RuntimeEndpoint, ServerError
from radixcluster.lang.chat_template import ChatTemplate, get_chat_template
from radixcluster.lang.ir import assistant, gen, select, system, user
from radixcluster.lang.program import SglFunction, function, set_default_backend
from radixcluster.lang.state import ForkGroup, ProgramState

__all__ = [
    "ChatTemplate",
    "ForkGroup",
    "ProgramState",
    "RuntimeEndpoint",
    "ServerError",
    "SglFunction",
    "assistant",
    "function",
    "gen",
    "get_chat_template",
    "select",
    "set_default_backend",
    "system",
    "user",
]
