"""A vLLM command line pasted to `radixcluster up`: vLLM's names of our flags act, its flags that
mean nothing here are accepted, `--tokenizer` names a tokenizer directory beside the GGUF (as
vLLM's GGUF guide does), and `--chat-template` renders chats in place of the model's template,
on the replica and, given the same template, on a gateway in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from radixcluster.model_config import load_model_config
from radixcluster.replica_plan import DEFAULT_MEM_FRACTION, memory_bytes
from radixcluster.router.text.tokenizer import load_tokenizer
from support.api_helpers import get, post
from support.servers import ServerHandle, launch_server, wait_replicas

pytestmark = pytest.mark.slow

# longer than SmolLM2's own rendering of a chat by a page, so a gateway that rendered chats with
# the model's template would predict a page less than the replica caches
TEMPLATE = (
    "A conversation between a user and an assistant who answers in as few words as it can.\n\n"
    "{% for m in messages %}### {{ m.role }}:\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant:\n{% endif %}"
)
CHAT = [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a colour."}]
TEMPLATE_TEXT = (
    "A conversation between a user and an assistant who answers in as few words as it can.\n\n"
    "### system:\nYou answer in one word.\n### user:\nName a colour.\n### assistant:\n"
)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, hf_tokenizer) -> Iterator[tuple[ServerHandle, ServerHandle]]:
    template = tmp_path_factory.mktemp("template") / "plain.jinja"
    template.write_text(TEMPLATE)
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    hf_tokenizer.save_pretrained(tokenizer)
    flags = (
        "--max-model-len 1024 --max-num-seqs 4 --block-size 16 --seed 7 --enforce-eager --swap-space 4 "
        "--enable-chunked-prefill --enable-auto-tool-choice --tool-call-parser hermes --disable-log-requests "
        "--kv-events-address tcp://127.0.0.1:0 --gpu-memory-utilization 0.9 --load-format gguf --quantization gguf"
    )
    with launch_server(*flags.split(), "--chat-template", str(template), "--tokenizer", str(tokenizer)) as replica:
        gateway_flags = (f"--replica={replica.url}", "--chat-template", str(template), "--tokenizer", str(tokenizer))
        with launch_server(*gateway_flags, command="gateway") as gateway:
            wait_replicas(gateway, 1)
            yield replica, gateway


def test_vllms_names_of_our_flags_act(servers, model_path) -> None:
    replica, _ = servers
    info = get(replica, "/get_server_info").json()
    assert (info["context_length"], info["max_running_requests"], info["page_size"]) == (1024, 4, 16)
    assert get(replica, "/v1/models").json()["data"][0]["max_model_len"] == 1024
    too_long = {"model": "m", "prompt": "word " * 1100, "max_tokens": 1}
    assert post(replica, "/v1/completions", too_long).status_code == 400
    # vLLM's 0.9 of a GPU is not taken as 0.9 of this host's RAM: the pool keeps the CPU's default share
    kv_bytes = load_model_config(model_path).kv_bytes_per_token(1, 4) * info["max_total_num_tokens"]
    assert kv_bytes < DEFAULT_MEM_FRACTION["cpu"] * memory_bytes("cpu")


def test_the_tokenizer_given_is_the_one_that_serves(servers, model_path) -> None:
    replica, _ = servers
    info = get(replica, "/get_model_info").json()
    assert info["tokenizer_path"] != info["model_path"] == str(model_path)
    assert Path(info["tokenizer_path"], "tokenizer.json").is_file()
    text = "Tokenizers agree: 12345 apples, naïve café."
    assert post(replica, "/tokenize", {"prompt": text}).json()["tokens"] == load_tokenizer(model_path).encode(text)


def test_the_chat_template_renders_chats_on_the_replica(servers) -> None:
    replica, _ = servers
    rendered = post(replica, "/tokenize", {"messages": CHAT}).json()
    expected = post(replica, "/tokenize", {"prompt": TEMPLATE_TEXT, "add_special_tokens": False}).json()
    assert rendered["tokens"] == expected["tokens"]
    chat = {"model": "m", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    answer = post(replica, "/v1/chat/completions", chat).json()
    assert answer["usage"]["prompt_tokens"] == rendered["count"]


def test_a_gateway_with_the_same_template_predicts_what_the_replica_caches(servers) -> None:
    replica, gateway = servers
    chat = {"model": "m", "messages": [*CHAT[:1], {"role": "user", "content": "Name a fruit."}], "max_tokens": 2}
    first = post(gateway, "/v1/chat/completions", chat).json()["usage"]
    wait_replicas(gateway, 1)
    again = post(gateway, "/v1/chat/completions", chat).json()["usage"]
    assert again["prompt_tokens"] == first["prompt_tokens"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["predicted_cached_tokens"] == again["prompt_tokens_details"]["cached_tokens"]
