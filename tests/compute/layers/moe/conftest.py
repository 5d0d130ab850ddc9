"""Triton's interpreter where there is no GPU. Set here, before any test module is collected:
@triton.jit picks the interpreter when a kernel is defined, so the variable must be set before
the first module that imports the kernels (test_gpu_moe.py is collected first)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
