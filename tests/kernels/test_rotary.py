"""Rotary embedding and RMSNorm against transformers' Llama implementation."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from radixcluster.kernels.norm import add_rms_norm, rms_norm
from radixcluster.kernels.rotary import apply_rotary, rope_cos_sin, rope_inv_freq

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    "scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 4.0}], ids=["plain", "llama3", "linear"]
)
def test_rotary_matches_transformers(scaling: dict | None) -> None:
    theta, head_dim = 500000.0, 64
    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": theta} | (scaling or {}),
    )
    hf_rope = LlamaRotaryEmbedding(config)
    positions = torch.tensor([0, 1, 7, 300, 9000, 100000])
    q = torch.randn(len(positions), 4, head_dim)
    k = torch.randn(len(positions), 2, head_dim)
    hf_cos, hf_sin = hf_rope(q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], hf_cos, hf_sin)

    inv_freq = rope_inv_freq(head_dim, theta, scaling)
    torch.testing.assert_close(inv_freq, hf_rope.inv_freq)
    cos, sin = rope_cos_sin(positions, inv_freq, torch.float32)
    torch.testing.assert_close(apply_rotary(q, cos, sin), hf_q[0].transpose(0, 1))
    torch.testing.assert_close(apply_rotary(k, cos, sin), hf_k[0].transpose(0, 1))


def test_unknown_rope_scaling_is_refused() -> None:
    with pytest.raises(ValueError, match="yarn"):
        rope_inv_freq(64, 10000.0, {"rope_type": "yarn", "factor": 4.0})


def test_rms_norm_matches_transformers() -> None:
    hf_norm = LlamaRMSNorm(32, eps=1e-5)
    hf_norm.weight.data = torch.randn(32)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    torch.testing.assert_close(rms_norm(x, hf_norm.weight, 1e-5), hf_norm(x))
    normed, summed = add_rms_norm(x, residual, hf_norm.weight, 1e-5)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(normed, hf_norm(x + residual))
