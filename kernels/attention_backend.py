"""Which paged-attention implementation a rank runs: Triton on CUDA, the torch reference
elsewhere, or either one forced by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixcluster.kernels.attention import AttentionMetadata, paged_attention, store_kv
from radixcluster.kernels.backend_names import ATTENTION_BACKENDS


@dataclass(frozen=True, slots=True)
class AttentionBackend:
    """The pair of functions a layer calls, and whether they read the metadata's gathered rows."""

    name: str
    store_kv: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    paged_attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]
    gather_rows: bool


TORCH_BACKEND = AttentionBackend("torch", store_kv, paged_attention, gather_rows=True)


def select_attention_backend(device: torch.device | str, requested: str = "auto") -> AttentionBackend:
    """``auto``: Triton on CUDA, torch elsewhere. ``triton`` off CUDA needs Triton's
    interpreter (``TRITON_INTERPRET=1`` set before the kernels are imported)."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    on_cuda = torch.device(device).type == "cuda"
    if requested == "torch" or (requested == "auto" and not on_cuda):
        return TORCH_BACKEND
    try:
        import triton
    except ImportError as exc:
        raise ValueError("the triton attention backend needs the 'triton' package installed") from exc
    if not on_cuda and not triton.knobs.runtime.interpret:
        raise ValueError(
            f"the triton attention backend runs on CUDA devices, not {torch.device(device).type!r} "
            "(set TRITON_INTERPRET=1 to run its kernels on Triton's CPU interpreter, or use --attention-backend torch)"
        )
    from radixcluster.kernels.triton_attention import triton_paged_attention
    from radixcluster.kernels.triton_kv_store import triton_store_kv

    return AttentionBackend("triton", triton_store_kv, triton_paged_attention, gather_rows=False)
