"""The router's tokenizer against transformers' tokenizer read from the same SmolLM2 GGUF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType as T
from gguf import GGUFWriter

from radixcluster.model_path import ModelPathError
from radixcluster.router.text.chat_template import read_chat_template, render_chat_template
from radixcluster.router.text.detokenizer import IncrementalDetokenizer
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer
from support.tool_template import TOOL_TEMPLATE

TEXTS = [
    "Hello, world! How are you today?",
    "你是一个资深Python工程师，请回答以下问题：\n\n如何实现一个LRU缓存？",
    "class LRUCache:\n    def __init__(self, capacity: int):\n        self.cap = capacity\n\n\tdef get(self, key):\n\t\treturn -1\n",
    "emoji 🎉👍🏽 and flags 🇯🇵 and ❤️",
    "numbers 3.14159, 1,000,000 and 2024-01-05; x=42",
    "multiple    spaces\n\n\n\nand newlines \r\n trailing   ",
    "<|im_start|>user\nhi<|im_end|>",
    "Ünïcödé façade — “quotes” ‘too’ … ∑∫√ 日本語のテキスト 한국어",
    "",
]

CONVERSATIONS = {
    "single_turn": [{"role": "user", "content": "What is 2+2?"}],
    "multi_turn_with_system": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "Hi! 👋"},
        {"role": "user", "content": "Write a haiku about caches."},
    ],
    "no_system": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ],
}


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> Tokenizer:
    return load_tokenizer(model_path)


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_encoding_matches_transformers(tokenizer: Tokenizer, hf_tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text)
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.is_special(1) and tokenizer.is_special(2) and not tokenizer.is_special(ids[1])
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.id_to_token(1) == "<|im_start|>"


def test_smolLM2_metadata(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert tokenizer.bos_token_id == 1
    assert not tokenizer.add_bos_token
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    # <|im_end|> is the GGUF eos; llama.cpp also ends generation at <|endoftext|>.
    assert tokenizer.eos_token_ids == (2, 0)


def test_digits_are_split_like_llama_cpp_smollm(tokenizer: Tokenizer) -> None:
    """tokenizer.ggml.pre == "smollm": llama.cpp (and SmolLM2's own tokenizer.json) isolate
    every digit before the GPT-2 split, so a run of spaces before a digit stays one piece.
    transformers' GGUF loader skips that step and gives ["x", "Ġ", "Ġ", "1"] here."""
    tokens = [tokenizer.id_to_token(i) for i in tokenizer.encode("x  12")]
    assert tokens == ["x", "ĠĠ", "1", "2"]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_chat_template_matches_transformers(tokenizer: Tokenizer, hf_tokenizer, name: str) -> None:
    messages = CONVERSATIONS[name]
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(messages) == expected
    no_prompt = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == no_prompt


def test_tools_and_tool_calls_are_rendered_as_transformers_renders_them(tokenizer: Tokenizer, hf_tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "巴黎"}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "Ask the tool."},
        {"role": "tool", "tool_call_id": "c1", "content": "18 degrees"},
    ]
    expected = hf_tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=TOOL_TEMPLATE, tokenize=False, add_generation_prompt=True
    )
    assert render_chat_template(TOOL_TEMPLATE, messages, True, tools, tokenizer.template_tokens) == expected
    assert '"arguments": {"city": "巴黎"}' in expected and '{"name": "get_weather"' in expected
    assert "<|im_start|>assistant\n<think>Ask the tool.</think><tool_call>" in expected


def test_chat_template_kwargs_are_the_templates_variables_as_in_transformers(
    tokenizer: Tokenizer, hf_tokenizer
) -> None:
    messages = CONVERSATIONS["single_turn"]
    for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
        expected = hf_tokenizer.apply_chat_template(
            messages, chat_template=TOOL_TEMPLATE, tokenize=False, add_generation_prompt=True, **kwargs
        )
        ours = render_chat_template(TOOL_TEMPLATE, messages, True, None, tokenizer.template_tokens, False, kwargs)
        assert ours == expected
        assert ours.endswith("<think>\n\n</think>\n\n") == (kwargs == {"enable_thinking": False})


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"messages": []}, "may not set messages"),
        ({"add_generation_prompt": False, "bos_token": "x"}, "may not set add_generation_prompt, bos_token"),
        ({"raise_exception": "no"}, "may not set raise_exception"),  # the template's own functions
        ({"range": 3}, "may not set range"),
    ],
)
def test_chat_template_kwargs_may_not_stand_for_what_the_server_sets(tokenizer: Tokenizer, kwargs, says) -> None:
    with pytest.raises(ValueError, match=says):
        tokenizer.apply_chat_template(CONVERSATIONS["single_turn"], template_kwargs=kwargs)


def test_a_template_that_fails_on_a_clients_value_is_the_clients_error(tokenizer: Tokenizer) -> None:
    template = "{{ messages[0].content + suffix }}"
    with pytest.raises(ValueError, match="failed on chat_template_kwargs: TypeError"):
        render_chat_template(template, CONVERSATIONS["single_turn"], template_kwargs={"suffix": {"a": 1}})
    assert (
        render_chat_template(template, CONVERSATIONS["single_turn"], template_kwargs={"suffix": "!"}) == "What is 2+2?!"
    )


@pytest.mark.parametrize(
    "last",
    ["The capital of France is", "Two words ", "", "a\nb"],
)
def test_continuing_the_final_message_matches_transformers(tokenizer: Tokenizer, hf_tokenizer, last: str) -> None:
    messages = [*CONVERSATIONS["single_turn"], {"role": "assistant", "content": last}]
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert tokenizer.apply_chat_template(messages, continue_final_message=True) == expected
    assert expected.endswith("<|im_start|>assistant\n" + last)
    user_last = CONVERSATIONS["single_turn"]  # transformers continues any role's message
    expected = hf_tokenizer.apply_chat_template(user_last, tokenize=False, continue_final_message=True)
    assert tokenizer.apply_chat_template(user_last, continue_final_message=True) == expected


def test_default_system_prompt_is_injected(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template(CONVERSATIONS["single_turn"])
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert prompt.endswith("<|im_start|>assistant\n")


def test_text_parts_are_joined(tokenizer: Tokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tokenizer.apply_chat_template(parts) == tokenizer.apply_chat_template([{"role": "user", "content": "a\nb"}])


def test_a_developer_message_is_a_system_message(tokenizer: Tokenizer) -> None:
    # OpenAI's newer clients send "developer" where they sent "system"; SGLang renders it as one
    chat = [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "Hi"}]
    system = [{**chat[0], "role": "system"}, chat[1]]
    assert tokenizer.apply_chat_template(chat) == tokenizer.apply_chat_template(system)
    assert tokenizer.apply_chat_template(chat).startswith("<|im_start|>system\nAnswer briefly.<|im_end|>")


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([], "non-empty list"),
        ("hi", "non-empty list"),
        (["hi"], "messages[0] must be an object"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": 3}], "messages[1].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0].content[0]"),
    ],
)
def test_bad_messages_raise_value_error(tokenizer: Tokenizer, messages, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        tokenizer.apply_chat_template(messages)


def test_hf_directory_equals_gguf(tokenizer: Tokenizer, hf_model_dir: Path) -> None:
    hf_dir = load_tokenizer(hf_model_dir)
    assert hf_dir.vocab_size == tokenizer.vocab_size
    assert hf_dir.chat_template == tokenizer.chat_template
    assert hf_dir.bos_token_id == tokenizer.bos_token_id and hf_dir.add_bos_token == tokenizer.add_bos_token
    assert 2 in hf_dir.eos_token_ids
    assert hf_dir.special_ids == tokenizer.special_ids
    for text in TEXTS:
        if any(c.isdigit() for c in text):
            continue  # the converted tokenizer.json lacks the smollm digit split (see above)
        assert hf_dir.encode(text) == tokenizer.encode(text)
    for messages in CONVERSATIONS.values():
        assert hf_dir.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)


def test_hf_directory_named_templates_and_generation_eos(hf_model_dir: Path, tmp_path: Path) -> None:
    shutil.copy(hf_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = {
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{{ messages[0]['content'] }}"},
        ],
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    tok = load_tokenizer(tmp_path)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>x"
    assert tok.eos_token_ids == (2, 0)
    assert tok.bos_token_id == 1


PLAIN_TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"


def test_a_chat_template_given_renders_chats_in_place_of_the_models(
    tokenizer: Tokenizer, model_path: Path, hf_model_dir: Path, tmp_path: Path
) -> None:
    file = tmp_path / "plain.jinja"
    file.write_text(PLAIN_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for template in (read_chat_template(str(file)), read_chat_template(PLAIN_TEMPLATE)):
        for path in (model_path, hf_model_dir):
            given = load_tokenizer(path, template)
            assert given.apply_chat_template(messages) == "[system] Be brief.\n[user] Hi\n[assistant] "
            assert given.encode("Hi there") == tokenizer.encode("Hi there")
            # the gateway's ids stand in for a replica's only where both render alike
            assert given.fingerprint != tokenizer.fingerprint
    assert load_tokenizer(model_path, None).fingerprint == tokenizer.fingerprint


@pytest.mark.parametrize(
    "value, says",
    [
        ("chatml", "no such file, nor a Jinja template"),
        ("/no/such/template.jinja", "no such file"),
        ("{% for m in messages %}{{ m.content }}", "line 1: Unexpected end of template"),
    ],
)
def test_a_chat_template_that_cannot_be_read_says_why(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        read_chat_template(value)


def test_a_template_file_is_jinja_or_hugging_faces_chat_template_json(tmp_path: Path) -> None:
    hf_json = tmp_path / "chat_template.json"
    hf_json.write_text(json.dumps({"chat_template": PLAIN_TEMPLATE}))
    assert read_chat_template(str(hf_json)) == PLAIN_TEMPLATE
    # tokenizer_config.json's named templates: transformers' default is the one named "default"
    named = [{"name": "tool_use", "template": "{{ tools }}"}, {"name": "default", "template": PLAIN_TEMPLATE}]
    hf_json.write_text(json.dumps({"chat_template": named}))
    assert read_chat_template(str(hf_json)) == PLAIN_TEMPLATE
    for other in ({"chat_template": named[:1]}, {"chat_template": 5, "note": "{{ x }}"}, named[:1]):
        hf_json.write_text(json.dumps(other))  # Jinja somewhere in it, yet no template: it was taken whole
        with pytest.raises(ValueError, match="JSON that holds no chat template"):
            read_chat_template(str(hf_json))
    # SGLang's docs' custom template: a JSON conversation template, not Jinja; it was taken as a
    # template without placeholders, and every chat became the file's own text
    sglang_json = tmp_path / "my_model_template.json"
    sglang_json.write_text(
        json.dumps(
            {
                "name": "my_model",
                "system": "<|im_start|>system",
                "user": "<|im_start|>user",
                "assistant": "<|im_start|>assistant",
                "sep_style": "CHATML",
                "sep": "<|im_end|>",
                "stop_str": ["<|im_end|>", "<|im_start|>"],
            }
        )
    )
    with pytest.raises(ValueError, match=r"my_model_template.json: SGLang's JSON conversation templates"):
        read_chat_template(str(sglang_json))
    constant = tmp_path / "constant.txt"
    constant.write_text("You are a helpful assistant.")
    with pytest.raises(ValueError, match="holds no Jinja"):
        read_chat_template(str(constant))


def test_missing_tokenizer_raises_model_path_error(tmp_path: Path) -> None:
    with pytest.raises(ModelPathError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelPathError, match="nope.gguf"):
        load_tokenizer(missing)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelPathError, match="garbage.gguf"):
        load_tokenizer(garbage)


def _write_gguf(path: Path, tokenizer_fields: dict, vocab: int = 4) -> Path:
    writer = GGUFWriter(path, "llama")
    for key, (value, kind) in tokenizer_fields.items():
        writer.add_key_value(key, value, kind)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _sentencepiece_gguf(path: Path) -> Path:
    """A tiny Llama-2-style vocabulary: byte-fallback tokens, ``▁`` pieces, scores, no merges."""
    pieces = [
        "▁",
        "h",
        "e",
        "l",
        "o",
        "w",
        "r",
        "d",
        "he",
        "ll",
        "llo",
        "hello",
        "▁hello",
        "▁w",
        "or",
        "▁wor",
        "▁world",
        "▁▁",
        "!",
    ]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    fields = {
        "llama.context_length": (64, T.UINT32),
        "llama.embedding_length": (4, T.UINT32),
        "llama.block_count": (1, T.UINT32),
        "llama.feed_forward_length": (8, T.UINT32),
        "llama.attention.head_count": (1, T.UINT32),
        "llama.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32),
        "tokenizer.ggml.model": ("llama", T.STRING),
        "tokenizer.ggml.tokens": (tokens, T.ARRAY),
        "tokenizer.ggml.scores": ([0.0] * 259 + [-float(i) for i in range(len(pieces))], T.ARRAY),
        "tokenizer.ggml.token_type": ([2, 3, 3] + [6] * 256 + [1] * len(pieces), T.ARRAY),
        "tokenizer.ggml.bos_token_id": (1, T.UINT32),
        "tokenizer.ggml.eos_token_id": (2, T.UINT32),
        "tokenizer.ggml.unknown_token_id": (0, T.UINT32),
    }
    return _write_gguf(path, fields, vocab=len(tokens))


def test_sentencepiece_gguf_matches_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    path = _sentencepiece_gguf(tmp_path / "sp.gguf")
    ours = load_tokenizer(path)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert ours.add_bos_token and ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    for text in ["hello world", " hello  world!", "héllo wörld 中 🎉", "hello</s>world", ""]:
        ids = ours.encode(text)
        assert ids == reference.encode(text)
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
        detok = IncrementalDetokenizer(ours)
        assert "".join(detok.add([i]) for i in ids) + detok.flush() == ours.decode(ids)


@pytest.mark.parametrize("text", TEXTS)
def test_each_tokens_bytes_spell_the_text_also_within_a_character(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()


def test_byte_fallback_tokens_are_their_bytes(tmp_path: Path) -> None:
    sp = load_tokenizer(_sentencepiece_gguf(tmp_path / "sp.gguf"))
    ids = sp.encode("hello 中", add_special_tokens=False)[-3:]  # 中's three bytes, one token each
    assert [sp.decode([i]) for i in ids] == ["\ufffd"] * 3
    assert b"".join(sp.token_bytes(i) for i in ids) == "中".encode()


def test_gguf_without_tokenizer_metadata(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "bare.gguf", {})
    with pytest.raises(ModelPathError, match=r"bare\.gguf.*no tokenizer metadata"):
        load_tokenizer(path)


def test_gguf_unsupported_tokenizer_model(tmp_path: Path) -> None:
    fields = {"tokenizer.ggml.model": ("bert", T.STRING), "tokenizer.ggml.tokens": (["[PAD]", "a"], T.ARRAY)}
    path = _write_gguf(tmp_path / "bert.gguf", fields)
    with pytest.raises(ModelPathError, match=r"bert\.gguf.*unsupported GGUF tokenizer model 'bert'"):
        load_tokenizer(path)


def test_what_every_continuation_of_a_text_encodes_alike_ends_before_its_last_piece(tokenizer: Tokenizer) -> None:
    header = "Answer in one sentence. "
    cut = tokenizer.shared_by_continuations(header)
    assert header[:cut] == "Answer in one sentence."  # " " + "Question" is one piece
    for more in ("Question: why?", "\nQ", "x"):
        assert tokenizer.encode(header + more)[: len(tokenizer.encode(header[:cut]))] == tokenizer.encode(header[:cut])
    assert tokenizer.shared_by_continuations("Hello") == 5  # one piece: all of it
    assert tokenizer.shared_by_continuations("hi<|im_end|>") == len("hi<|im_end|>")
