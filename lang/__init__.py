"""radixcluster.lang: a frontend language for LLM programs (roles, gen, select, fork) whose calls share prefixes through the radix cache."""

from importlib.metadata import version

from radixcluster.lang.backend import RuntimeEndpoint, ServerError
from radixcluster.lang.chat_template import ChatTemplate, get_chat_template
from radixcluster.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixcluster.lang.ir import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from radixcluster.lang.program import SglFunction, flush_cache, function, get_server_info, set_default_backend
from radixcluster.lang.state import ForkGroup, ProgramState

__version__ = version("radixcluster")  # the package's, not imported from it: lang speaks HTTP only

__all__ = [
    "__version__",
    "ChatTemplate",
    "ForkGroup",
    "ProgramState",
    "RuntimeEndpoint",
    "ServerError",
    "SglFunction",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_chat_template",
    "greedy_token_selection",
    "get_server_info",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
