"""Without a GPU, the Triton kernel tests run on Triton's interpreter over CPU tensors.

Triton decides at decoration time whether a kernel is interpreted, so this must be set
before anything imports the kernel modules; conftest files load before their tests."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
