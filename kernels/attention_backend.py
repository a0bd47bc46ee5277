"""Which paged-attention implementation a rank runs: the native CPU kernels, Triton on CUDA,
or the torch reference, by name or chosen for the device (``auto``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixcluster.kernels.attention import AttentionMetadata, paged_attention, store_kv
from radixcluster.kernels.backend_names import ATTENTION_BACKENDS
from radixcluster.kernels.layer_ops import LayerOps, StoreKV, torch_layer_ops


@dataclass(frozen=True, slots=True)
class AttentionBackend:
    """What a layer calls: the K/V store and attention, whether they read the metadata's
    gathered rows, and the set of elementwise steps that goes with them. ``detail`` says
    more about the path (the native kernels' instruction set)."""

    name: str
    store_kv: StoreKV
    paged_attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, float], torch.Tensor]
    gather_rows: bool
    layer_ops: LayerOps
    detail: str = ""


TORCH_BACKEND = AttentionBackend("torch", store_kv, paged_attention, True, torch_layer_ops(store_kv))


def select_attention_backend(
    device: torch.device | str, requested: str = "auto", head_dim: int = 64
) -> AttentionBackend:
    """``auto``: Triton on CUDA, the native kernels on the CPU when they build and support
    ``head_dim`` (one line on stderr says why not), else torch. ``triton`` off CUDA needs
    Triton's interpreter (``TRITON_INTERPRET=1`` set before the kernels are imported)."""
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {ATTENTION_BACKENDS}, got {requested!r}")
    kind = torch.device(device).type
    if requested == "torch":
        return TORCH_BACKEND
    if requested == "native" or (requested == "auto" and kind == "cpu"):
        return _native(kind, head_dim, required=requested == "native")
    if requested == "auto" and kind != "cuda":
        return TORCH_BACKEND
    return _triton(kind)


def _native(kind: str, head_dim: int, required: bool) -> AttentionBackend:
    from radixcluster.kernels import native

    reason = f"they run on the CPU, not {kind!r}" if kind != "cpu" else native.head_dim_problem(head_dim)
    if reason is None:
        try:
            isa = native.load()
        except native.NativeBuildError as exc:
            reason = str(exc)
    if reason is not None:
        if required:
            raise ValueError(f"the native attention backend is unavailable: {reason}")
        native.say_unavailable(reason)
        return TORCH_BACKEND
    from radixcluster.kernels.native_attention import native_paged_attention
    from radixcluster.kernels.native_ops import native_layer_ops, native_store_kv

    return AttentionBackend("native", native_store_kv, native_paged_attention, False, native_layer_ops(), isa)


def _triton(kind: str) -> AttentionBackend:
    try:
        import triton
    except ImportError as exc:
        raise ValueError("the triton attention backend needs the 'triton' package installed") from exc
    if kind != "cuda" and not triton.knobs.runtime.interpret:
        raise ValueError(
            f"the triton attention backend runs on CUDA devices, not {kind!r} "
            "(set TRITON_INTERPRET=1 to run its kernels on Triton's CPU interpreter, or use --attention-backend torch)"
        )
    from radixcluster.kernels.triton_attention import triton_paged_attention
    from radixcluster.kernels.triton_kv_store import triton_store_kv

    return AttentionBackend("triton", triton_store_kv, triton_paged_attention, False, torch_layer_ops(triton_store_kv))
