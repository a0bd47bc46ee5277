"""What linear layers compute with besides ``F.linear``: the native product
(``kernels/csrc/matvec.cpp``) on a copy of the weight in its blocked layout, which reads the
weight at nearly the memory's bandwidth for a decode step's few rows and, on the AVX-512 EPYC,
beat oneDNN's packed product up to 2,048 rows in fp32 and 256 in bf16 (bf16 dot products), and
on the AMX Xeon in bf16 up to 128 (AMX tiles from 4 rows);
oneDNN's prepacked copy, where the native kernels are not loaded; and, for bfloat16 on a CPU without
bfloat16 arithmetic, the product of the operands widened to float32, which MKL's sgemm
computes 2-7x faster than its emulated bfloat16 kernels.

Measured with ``benchmarks/bench_linear.py`` and ``benchmarks/bench_few_rows.py``; oneDNN's
and the native product's float32 results are not bitwise MKL's (the greedy outputs of the
reference prompts still equal transformers'); ``--disable-weight-prepack`` keeps one copy of
every weight (F.linear, and widening).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from functools import cache

import torch
import torch.nn.functional as F
from torch import nn

from radixcluster.cpu_info import cpuinfo_field, cpuinfo_text
from radixcluster.kernels.layer_ops import LayerOps, Matvec

logger = logging.getLogger(__name__)

# With bf16 dot products (AVX-512 BF16) the native product takes a bf16 weight two input features
# at a time: on the AVX-512 EPYC a step's bf16 linear work ran 2.3-3.0x faster than oneDNN's packed
# product at 1 row, 1.4-1.6x at 3-8, 1.3x at 16-64 and 1.13x at 256 (benchmarks/bench_few_rows.py
# --dtype bfloat16). With AMX it takes 4 rows or more on tiles: on the AMX Xeon a step's bf16
# linear work ran 2.2x oneDNN's packed (AMX) product at 1 row, 1.5-1.6x at 4-32, 1.15x at 64 and
# level at 128.

# The packed weight serves inputs of PACKED_MIN_ROWS to PACKED_MAX_ROWS rows (that the native
# product does not), F.linear the others. On the 2-core AVX2 EPYC, float32, 1 thread, CPU
# time (benchmarks/bench_linear.py, docs/BENCHMARKS.md "Linear layers"), a step's linear work
# ran 0.87x packed at 1 row (MKL's gemv), 1.5-1.8x at 2-8, 1.2x at 32, 1.1x at 64-128 and
# 0.93-0.95x from 256 to 2048; on the AMX Xeon of the profile 2.07x at 7 rows, 1.46x at 32,
# 0.75x at 2048 (bf16 1.33x, 1.12x, 0.48x). On an AMD CPU with AVX-512 it serves every row
# count from PACKED_MIN_ROWS (``packed_max_rows``).
PACKED_MIN_ROWS = 2
PACKED_MAX_ROWS = 128
# The batch size oneDNN chooses the blocked layout for (its "probe" M).
PACK_FOR_ROWS = 32
# Smaller weights stay unpacked: a packed call costs ~25 us more than F.linear's ~4 us before
# any arithmetic (1 thread, CPU time), which the packing repays only on large weights. At 8 and
# 32 rows packed / F.linear was 0.24-0.34x at 64 x 128, 0.5-0.7x at 256 x 256, 0.9x at
# 512 x 256, 0.9-1.1x at 576 x 576 (SmolLM2's o_proj), 1.3-1.5x at 3072 x 576 (gate_up_proj).
PACK_MIN_PARAMS = 1 << 19


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` (``[out, in]``) in oneDNN's blocked layout, or None where oneDNN cannot run
    this dtype on this CPU (bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT)."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_FOR_ROWS)
    except RuntimeError as exc:
        logger.info("oneDNN does not prepack %s weights here (%s): F.linear serves them", weight.dtype, exc)
        return None


@cache
def cpu_has_bf16_arithmetic() -> bool:
    """Whether this CPU computes in bfloat16 (AVX-512 BF16 or AMX); without it oneDNN and ATen
    convert every operand, and F.linear on bfloat16 runs ~4x slower than the native product
    (1 to 512 rows) and 2-7x slower than sgemm on the operands widened to float32 (8 to 512
    rows; benchmarks/bench_few_rows.py on the AVX2 EPYC)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


@cache
def packed_max_rows() -> int:
    """The most rows a packed weight serves: PACKED_MAX_ROWS, or every row count on an AMD CPU
    with AVX-512. MKL's sgemm, behind F.linear, is Intel's; on the AVX-512 EPYC (Zen 4) oneDNN's
    packed product was faster at every size: a step's fp32 linear work 1.45x at 256 rows, 1.28x
    at 512 and 1.21x at 2,048, bf16 1.02-1.04x (2 threads, wall time; docs/BENCHMARKS.md "Few
    rows on an AVX-512 EPYC"), where Intel's AMX Xeon ran 0.75x at 2,048."""
    amd = cpuinfo_field("vendor_id", cpuinfo_text()) == "AuthenticAMD"
    return sys.maxsize if amd and torch.cpu._is_avx512_supported() else PACKED_MAX_ROWS


@dataclass(frozen=True, slots=True)
class FastLinear:
    """A layer's faster paths: ``matvec`` (the native product, on ``blocked``, the weight in its
    layout) serves 1 to ``matvec_rows`` rows, ``packed`` (oneDNN) PACKED_MIN_ROWS to
    ``packed_rows`` rows; ``widen``: the other row counts compute on float32 copies of the
    bfloat16 operands."""

    packed: torch.Tensor | None = None
    matvec: Matvec | None = None
    blocked: torch.Tensor | None = None
    matvec_rows: int = 1
    widen: bool = False
    packed_rows: int = PACKED_MAX_ROWS


def linear(
    x: torch.Tensor, weight: torch.Tensor, fast: FastLinear | None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T + bias`` (``x``: ``[M, in]``): through ``fast`` where it serves M rows,
    else ``F.linear``."""
    if fast is not None:
        rows = x.shape[0]
        if rows <= fast.matvec_rows and fast.matvec is not None and fast.blocked is not None:
            out = fast.matvec(x, fast.blocked)
            return out if bias is None else out.add_(bias)
        if fast.packed is not None and PACKED_MIN_ROWS <= rows <= fast.packed_rows:
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), fast.packed, bias, "none", [], "")
        if fast.widen:
            wide_bias = None if bias is None else bias.float()
            return F.linear(x.float(), weight.float(), wide_bias).to(x.dtype)
    return F.linear(x, weight, bias)


def prepare_linears(model: nn.Module, prepack: bool, ops: LayerOps) -> int:
    """When ``prepack``, give every layer with a ``fast`` slot its FastLinear: its weight in the
    layout of ``ops``'s native product for up to ``packed_max_rows()`` rows, and a oneDNN-packed copy
    where it has at least PACK_MIN_PARAMS weights and some row counts up to
    ``packed_max_rows()`` are left to it; besides, and without ``prepack`` too, widening where the
    weight is bfloat16 and the CPU has no bfloat16 arithmetic. Returns the bytes the copies take."""
    total = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not hasattr(module, "fast") or not isinstance(weight, torch.Tensor):
            continue
        block = ops.block_weight if prepack and ops.matvec is not None else None
        blocked = block(weight) if block is not None else None
        rows = packed_max_rows() if blocked is not None else 0
        left = prepack and weight.numel() >= PACK_MIN_PARAMS and packed_max_rows() > rows
        packed = pack_weight(weight) if left else None
        total += sum(t.numel() * t.element_size() for t in (blocked, packed) if t is not None)
        widen = weight.dtype == torch.bfloat16 and not cpu_has_bf16_arithmetic()
        useful = packed is not None or blocked is not None or widen
        fast = FastLinear(packed, ops.matvec, blocked, rows, widen, packed_max_rows()) if useful else None
        setattr(module, "fast", fast)  # noqa: B010  # a plain attribute: nn.Module's typing takes no None
    return total
