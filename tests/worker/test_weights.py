"""iter_weights against transformers: the embedded GGUF, its sharded Hugging Face copy, tiny
random Llama and Qwen2 models as safetensors and as GGUF, and every bad input we name."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from radixcluster.model_config import load_model_config
from radixcluster.model_path import INDEX_FILE, ModelPathError
from radixcluster.worker.gguf_weights import hf_name
from radixcluster.worker.weights import expected_shapes, iter_weights

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _load(path: Path) -> dict[str, torch.Tensor]:
    return dict(iter_weights(path, load_model_config(path)))


def _assert_same(loaded: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    reference = model.state_dict()
    if model.config.tie_word_embeddings:
        del reference["lm_head.weight"]
    assert set(loaded) == set(reference)
    for name, tensor in loaded.items():
        assert tensor.dtype == torch.float32 and tensor.device.type == "cpu", name
        torch.testing.assert_close(tensor, reference[name].float(), rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False)).eval()


@pytest.fixture(scope="module")
def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(1)
    return Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=True)).eval()


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama: LlamaForCausalLM) -> Path:
    """The tiny Llama as float32 safetensors in several shards with an index."""
    directory = tmp_path_factory.mktemp("tiny_llama")
    tiny_llama.save_pretrained(directory, max_shard_size="100KB")
    return directory


def _gguf_names(arch: gguf.MODEL_ARCH, num_layers: int) -> dict[str, str]:
    """Hugging Face name -> llama.cpp name, from the gguf package's own tensor names."""
    names = {}
    for template in (gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]):
        for layer in range(num_layers if "{bid}" in template else 1):
            for kind in ("weight", "bias"):
                gguf_name = f"{template.format(bid=layer)}.{kind}"
                if (name := hf_name(gguf_name)) is not None:
                    names[name] = gguf_name
    return names


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf ``permute``, which our loader must undo."""
    head_half = weights.shape[0] // n_head // 2
    return weights.reshape(n_head, 2, head_half, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _write_gguf(path: Path, model: torch.nn.Module, leave_out: str | None = None) -> Path:
    """Write ``model`` as a float32 GGUF the way llama.cpp's converter would."""
    config = model.config
    arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2}[config.model_type]
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    names = _gguf_names(arch, config.num_hidden_layers)
    state = model.state_dict()
    if config.tie_word_embeddings:
        del state["lm_head.weight"]
    for name, tensor in state.items():
        weights = tensor.float().numpy()
        if arch == gguf.MODEL_ARCH.LLAMA and ".q_proj." in name:
            weights = _llama_cpp_permute(weights, config.num_attention_heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and ".k_proj." in name:
            weights = _llama_cpp_permute(weights, config.num_key_value_heads)
        if names[name] != leave_out:
            writer.add_tensor(names[name], weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_matches_transformers(model_path: Path, hf_model) -> None:
    config = load_model_config(model_path)
    loaded = dict(iter_weights(model_path, config))
    assert set(loaded) == set(expected_shapes(config))
    assert "lm_head.weight" not in loaded
    _assert_same(loaded, hf_model)


def test_sharded_hf_dir_matches_transformers(hf_model_dir: Path, hf_model) -> None:
    shards = set(json.loads((hf_model_dir / INDEX_FILE).read_text())["weight_map"].values())
    assert len(shards) > 1
    _assert_same(_load(hf_model_dir), hf_model)


def test_hf_dir_has_tokenizer_and_generation_config(hf_model_dir: Path) -> None:
    assert (hf_model_dir / "tokenizer.json").is_file()
    assert "chat_template" in json.loads((hf_model_dir / "tokenizer_config.json").read_text())
    assert json.loads((hf_model_dir / "generation_config.json").read_text())["eos_token_id"] == 2


def test_untied_llama_yields_lm_head(tiny_llama_dir: Path, tiny_llama: LlamaForCausalLM) -> None:
    loaded = _load(tiny_llama_dir)
    assert "lm_head.weight" in loaded
    _assert_same(loaded, tiny_llama)


def test_bf16_safetensors_are_upcast(tmp_path: Path, tiny_llama: LlamaForCausalLM) -> None:
    bf16 = LlamaForCausalLM(tiny_llama.config).to(torch.bfloat16)
    bf16.load_state_dict(tiny_llama.state_dict())
    bf16.save_pretrained(tmp_path)
    _assert_same(_load(tmp_path), bf16)


def test_qwen2_safetensors_with_qkv_bias(tmp_path: Path, tiny_qwen2: Qwen2ForCausalLM) -> None:
    tiny_qwen2.save_pretrained(tmp_path)
    loaded = _load(tmp_path)
    assert {"model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias"} <= set(loaded)
    _assert_same(loaded, tiny_qwen2)


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_qwen2"])
def test_gguf_written_like_llama_cpp_reads_back(
    tmp_path: Path, model_fixture: str, request: pytest.FixtureRequest
) -> None:
    # llama's q/k rows come back un-permuted; qwen2's (weights and biases) were never permuted.
    model = request.getfixturevalue(model_fixture)
    _assert_same(_load(_write_gguf(tmp_path / "tiny.gguf", model)), model)


@contextlib.contextmanager
def _raises_naming(path: Path, problem: str = "") -> Iterator[None]:
    """Expect one ModelPathError whose message names ``path`` and ``problem``."""
    with pytest.raises(ModelPathError) as err:
        yield
    assert str(path) in str(err.value) and problem in str(err.value), str(err.value)


def _truncated_copy(source: Path, target: Path) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    return target


def _copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _first_shard(directory: Path) -> Path:
    return sorted(directory.glob("*.safetensors"))[0]


def test_missing_path_is_named(tmp_path: Path, tiny_llama_dir: Path) -> None:
    path = tmp_path / "nowhere.gguf"
    with _raises_naming(path, "does not exist"):
        iter_weights(path, load_model_config(tiny_llama_dir))


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with _raises_naming(tmp_path, "GPT2LMHeadModel"):
        load_model_config(tmp_path)


def test_truncated_gguf_is_named(tmp_path: Path, model_path: Path) -> None:
    config = load_model_config(model_path)
    path = _truncated_copy(model_path, tmp_path / "half.gguf")
    with _raises_naming(path):
        iter_weights(path, config)


def test_gguf_missing_tensor_is_named(tmp_path: Path, tiny_llama: LlamaForCausalLM) -> None:
    path = _write_gguf(tmp_path / "tiny.gguf", tiny_llama, leave_out="blk.1.ffn_up.weight")
    with _raises_naming(path, "model.layers.1.mlp.up_proj.weight"):
        iter_weights(path, load_model_config(path))


def test_truncated_safetensors_is_named(tmp_path: Path, tiny_llama_dir: Path) -> None:
    directory = _copy_dir(tiny_llama_dir, tmp_path / "model")
    shard = _truncated_copy(_first_shard(tiny_llama_dir), _first_shard(directory))
    with _raises_naming(shard):
        iter_weights(directory, load_model_config(directory))


def test_corrupt_safetensors_header_is_named(tmp_path: Path, tiny_llama_dir: Path) -> None:
    directory = _copy_dir(tiny_llama_dir, tmp_path / "model")
    shard = _first_shard(directory)
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + shard.read_bytes()[24:])
    with _raises_naming(shard):
        iter_weights(directory, load_model_config(directory))


def test_index_naming_a_missing_shard_is_named(tmp_path: Path, tiny_llama_dir: Path) -> None:
    directory = _copy_dir(tiny_llama_dir, tmp_path / "model")
    shard = _first_shard(directory)
    shard.unlink()
    with _raises_naming(directory, shard.name):
        iter_weights(directory, load_model_config(directory))


def test_untied_dir_without_lm_head_is_named(tmp_path: Path, tiny_qwen2: Qwen2ForCausalLM) -> None:
    tiny_qwen2.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"tie_word_embeddings": False}))
    with _raises_naming(tmp_path, "lm_head.weight"):
        iter_weights(tmp_path, load_model_config(tmp_path))


def test_dir_without_safetensors_is_named(tmp_path: Path, tiny_llama_dir: Path) -> None:
    shutil.copy(tiny_llama_dir / "config.json", tmp_path / "config.json")
    with _raises_naming(tmp_path, "safetensors"):
        iter_weights(tmp_path, load_model_config(tmp_path))


def test_weights_that_do_not_fit_the_config_are_named(tiny_llama_dir: Path) -> None:
    narrower = dataclasses.replace(load_model_config(tiny_llama_dir), intermediate_size=96)
    with _raises_naming(tiny_llama_dir, "mlp.gate_proj.weight has shape"):
        list(iter_weights(tiny_llama_dir, narrower))
