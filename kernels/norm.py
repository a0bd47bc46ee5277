"""RMSNorm, optionally fused with the residual add that precedes it (torch reference)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in float32, scale by ``weight`` in the input dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + x`` normalised, and that sum (the next residual)."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed
