"""Linear layers' faster paths: the packed path computes F.linear's result at every row count it
serves and refuses cleanly where oneDNN cannot run the dtype; the native product serves its rows on
the blocked copy; they cover every linear layer and the LM head of SmolLM2, tied to the embedding or
not."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixcluster.kernels import native
from radixcluster.kernels.attention_backend import TORCH_BACKEND
from radixcluster.model_config import load_model_config
from radixcluster.replica_plan import packed_weight_bytes
from radixcluster.worker.llama import LlamaForCausalLM
from radixcluster.worker.packed_linear import (
    PACK_MIN_PARAMS,
    PACKED_MAX_ROWS,
    PACKED_MIN_ROWS,
    FastLinear,
    cpu_has_bf16_arithmetic,
    linear,
    pack_weight,
    packed_max_rows,
    prepare_linears,
)
from radixcluster.worker.parallel import TPGroup
from radixcluster.worker.tp_layers import RowParallelLinear

ROWS = sorted({1, PACKED_MIN_ROWS, 7, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1, 300})


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_float32_linear_equals_f_linear(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 80, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    x = torch.randn(rows, 80, generator=generator)
    packed = pack_weight(weight)
    assert packed is not None  # oneDNN runs float32 on every x86-64 CPU torch supports
    got = linear(x, weight, FastLinear(packed), bias)
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_the_packed_weight_serves_up_to_its_packed_rows_and_f_linear_beyond():
    generator = torch.Generator().manual_seed(1)
    weight, x = torch.randn(96, 80, generator=generator), torch.randn(300, 80, generator=generator)
    packed = pack_weight(weight)
    onednn = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    assert torch.equal(linear(x, weight, FastLinear(packed, packed_rows=300)), onednn)
    assert torch.equal(linear(x, weight, FastLinear(packed, packed_rows=299)), F.linear(x, weight))


def test_bf16_packs_only_where_onednn_runs_it():
    weight = torch.randn(64, 32).to(torch.bfloat16)
    packed = pack_weight(weight)
    assert (packed is not None) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    x = torch.randn(8, 32).to(torch.bfloat16)
    torch.testing.assert_close(linear(x, weight, FastLinear(packed)), F.linear(x, weight))


def test_an_unpacked_layer_is_f_linear_at_every_row_count():
    weight, x = torch.randn(16, 8), torch.randn(PACKED_MIN_ROWS, 8)
    assert torch.equal(linear(x, weight, None), F.linear(x, weight))


def test_up_to_matvec_rows_go_through_the_matvec_and_more_do_not():
    native.load()
    from radixcluster.kernels.native_ops import native_block_weight, native_matvec

    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 80, generator=generator), torch.randn(96, generator=generator)
    blocked = native_block_weight(weight)
    fast = FastLinear(pack_weight(weight), native_matvec, blocked, matvec_rows=4)
    for rows in (1, 4):
        x = torch.randn(rows, 80, generator=generator)
        assert torch.equal(linear(x, weight, fast), native_matvec(x, blocked))
        assert torch.equal(linear(x, weight, fast, bias), native_matvec(x, blocked) + bias)
        torch.testing.assert_close(linear(x, weight, fast, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    more = torch.randn(5, 80, generator=generator)
    assert torch.equal(linear(more, weight, fast), linear(more, weight, FastLinear(fast.packed)))


@pytest.mark.parametrize("tied", [True, False])
def test_every_large_linear_layer_and_the_lm_head_is_packed(model_path, tied):
    config = replace(load_model_config(model_path), tie_word_embeddings=tied)
    model = LlamaForCausalLM(config, TPGroup())
    packed_bytes = prepare_linears(model, prepack=True, ops=TORCH_BACKEND.layer_ops)
    packed = {name for name, module in model.named_modules() if getattr(module, "fast", None) is not None}
    assert all(model.get_submodule(name).fast.packed_rows == packed_max_rows() for name in packed)
    layer = "model.layers.0."
    # SmolLM2: qkv 960 x 576, gate_up 3072 x 576, down 576 x 1536 and the LM head are large enough;
    # o_proj (576 x 576) stays on F.linear
    expected = {layer + "self_attn.qkv_proj", layer + "mlp.gate_up_proj", layer + "mlp.down_proj"}
    assert {name for name in packed if name.startswith(layer)} == expected
    assert len(packed) == 3 * config.num_layers + 1 and "lm_head" in packed
    o_proj = model.model.layers[0].self_attn.o_proj.weight
    assert packed_bytes == packed_weight_bytes(config, 4) - config.num_layers * o_proj.numel() * 4
    # a tied LM head still shares the embedding's plain weight: only the packed copy is extra
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def native_layer_ops():
    native.load()
    from radixcluster.kernels.native_ops import native_layer_ops

    return native_layer_ops()


def test_with_the_native_product_every_linear_layer_gets_its_blocked_copy(model_path):
    config = load_model_config(model_path)
    model = LlamaForCausalLM(config, TPGroup())
    ops = native_layer_ops()
    copies = prepare_linears(model, prepack=True, ops=ops)
    fast = {name: module.fast for name, module in model.named_modules() if hasattr(module, "fast")}
    assert len(fast) == 4 * config.num_layers + 1
    assert all(f is not None and f.matvec is ops.matvec and f.blocked is not None for f in fast.values())
    assert all(f.matvec_rows == packed_max_rows() for f in fast.values())
    # the blocked copy serves every row count a oneDNN copy would: no second copy
    assert all(f.packed is None for f in fast.values())
    assert copies == packed_weight_bytes(config, 4)


def test_without_prepacking_no_layer_gets_a_copy(model_path):
    config = replace(load_model_config(model_path), num_layers=1)
    model = LlamaForCausalLM(config, TPGroup())
    assert prepare_linears(model, prepack=False, ops=native_layer_ops()) == 0
    assert all(getattr(m, "fast", None) is None for m in model.modules())


def test_a_bfloat16_weight_gets_the_native_copy_alone(model_path):
    config = replace(load_model_config(model_path), num_layers=1)
    model = LlamaForCausalLM(config, TPGroup()).to(torch.bfloat16)
    prepare_linears(model, prepack=True, ops=native_layer_ops())
    head = model.lm_head.fast
    assert head.matvec_rows == packed_max_rows()
    assert head.blocked is not None and head.packed is None


@pytest.mark.parametrize("with_bias", [False, True])
def test_a_widened_bf16_layer_is_f_linear_of_the_float32_operands_rounded_once(with_bias):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=generator).to(torch.bfloat16)
    bias = torch.randn(48, generator=generator).to(torch.bfloat16) if with_bias else None
    x = torch.randn(33, 40, generator=generator).to(torch.bfloat16)
    out = linear(x, weight, FastLinear(widen=True), bias)
    wide_bias = None if bias is None else bias.float()
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, F.linear(x.float(), weight.float(), wide_bias).to(torch.bfloat16))


def test_bf16_layers_widen_exactly_where_the_cpu_has_no_bf16_arithmetic(model_path):
    config = replace(load_model_config(model_path), num_layers=1)
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaForCausalLM(config, TPGroup()).to(dtype)
        prepare_linears(model, prepack=False, ops=TORCH_BACKEND.layer_ops)
        fast = [m.fast for m in model.modules() if hasattr(m, "fast")]
        widened = dtype == torch.bfloat16 and not cpu_has_bf16_arithmetic()
        assert all((f is not None and f.widen) == widened for f in fast)


def test_small_weights_stay_unpacked():
    small = nn.Sequential(RowParallelLinear(PACK_MIN_PARAMS // 64 - 1, 64, TPGroup()))
    assert prepare_linears(small, prepack=True, ops=TORCH_BACKEND.layer_ops) == 0 and small[0].fast is None
