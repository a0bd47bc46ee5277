"""A model's shape decides which tensor-parallel sizes can split it, and `radixcluster up`
refuses any other at once, in one line, before starting a process; a config this engine would
compute otherwise than the model was trained is refused when it is read, naming what."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from radixcluster.model_config import load_model_config
from radixcluster.model_path import ModelPathError
from support.servers import free_port, radixcluster_command


def fitting(config, sizes) -> list[int]:
    return [n for n in sizes if config.tp_size_problem(n) is None]


def test_the_embedded_model_splits_over_1_or_3_ranks(model_path: Path) -> None:
    config = load_model_config(model_path)  # 9 attention heads, 3 KV heads, 1536 MLP channels
    assert fitting(config, range(1, 19)) == [1, 3]
    assert config.tp_size_problem(2) == (
        "its 9 attention heads do not split evenly over 2 ranks; "
        "its 3 KV heads do not split evenly over 2 ranks (sizes that fit: 1, 3)"
    )
    # 9 ranks would hold one attention head each, and each KV head three times, but not the MLP
    assert config.tp_size_problem(9) == "its 1536 MLP channels do not split evenly over 9 ranks (sizes that fit: 1, 3)"


def test_ranks_beyond_the_kv_heads_replicate_them_evenly(model_path: Path) -> None:
    # a Llama-3-8B-like shape: 32 attention heads over 8 KV heads
    config = dataclasses.replace(load_model_config(model_path), num_heads=32, num_kv_heads=8, intermediate_size=12288)
    assert fitting(config, range(1, 33)) == [1, 2, 4, 8, 16, 32]
    # 24 heads over 8 KV heads: 12 ranks split the heads, but not the KV heads into whole copies
    config = dataclasses.replace(config, num_heads=24)
    assert (
        config.tp_size_problem(12)
        == "its 8 KV heads do not split evenly over 12 ranks (sizes that fit: 1, 2, 4, 8, 24)"
    )


def test_up_refuses_a_tp_size_the_model_cannot_split_before_starting_anything() -> None:
    done = subprocess.run(
        [*radixcluster_command(), "up", "--tp-size", "8", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "radixcluster: error: --tp-size 8 cannot split SmolLM2-135M-Instruct: "
        "its 9 attention heads do not split evenly over 8 ranks; "
        "its 3 KV heads do not split evenly over 8 ranks (sizes that fit: 1, 3)"
    )
    assert done.stdout == ""


def test_a_gguf_and_its_hugging_face_directory_name_the_same_architecture(model_path: Path, hf_model_dir: Path) -> None:
    # SGLang's /model_info reports these names; a GGUF file's are its converter's source class
    gguf, hf = load_model_config(model_path), load_model_config(hf_model_dir)
    assert (gguf.model_type, gguf.architectures) == ("llama", ("LlamaForCausalLM",))
    assert (hf.model_type, hf.architectures) == ("llama", ("LlamaForCausalLM",))


def config_dir(tmp_path: Path, hf_model_dir: Path, **changes: Any) -> Path:
    """A copy of the converted model's config.json with ``changes`` (None removes a field)."""
    config = {**json.loads((hf_model_dir / "config.json").read_text()), **changes}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return tmp_path


@pytest.mark.parametrize(
    "changes, says",
    [
        (
            {"num_attention_heads": None, "hidden_size": None},
            "lacks hidden_size, num_attention_heads (an integer each)",
        ),
        ({"intermediate_size": "1536"}, "lacks intermediate_size"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act 'gelu' (the MLP computes silu)"),
        ({"mlp_bias": True}, "mlp_bias (biases on the MLP's projections) is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling 'yarn'"),
    ],
)
def test_a_config_the_engine_would_compute_otherwise_is_refused_naming_what(tmp_path, hf_model_dir, changes, says):
    with pytest.raises(ModelPathError) as caught:
        load_model_config(config_dir(tmp_path, hf_model_dir, **changes))
    assert says in str(caught.value) and str(tmp_path) in str(caught.value)


def test_silu_under_either_name_is_served(tmp_path, hf_model_dir):
    assert load_model_config(config_dir(tmp_path, hf_model_dir, hidden_act="swish")).hidden_size == 576


@pytest.mark.parametrize(
    "changes, window",
    [
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096}, 4096),
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": None}, None),
        # Qwen2's window is off unless use_sliding_window (unsaid: false), and then slides only the
        # layers from max_window_layers (unsaid: 28) on; a layer_types list names the sliding layers
        ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": False}, None),
        ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096}, None),
        ({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096, "use_sliding_window": True}, 4096),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "sliding_window": 4096,
                "use_sliding_window": True,
                "max_window_layers": 30,
            },
            None,
        ),
        ({"sliding_window": 4096, "layer_types": ["full_attention"] * 30}, None),
        ({"sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"] * 15}, 4096),
    ],
)
def test_the_context_stops_at_a_sliding_window(tmp_path, hf_model_dir, changes, window):
    config = load_model_config(config_dir(tmp_path, hf_model_dir, **changes))
    assert config.sliding_window == window
    assert config.context_limit == min(window or 8192, config.max_position_embeddings) == (window or 8192)
