"""Kernel tests: make the Triton kernels runnable on CPU tensors in this pytest process.

triton picks compiled vs interpreted mode at `import triton` time (see bloom_kernels/dispatch.py), and
transformers/deepspeed import triton, so TRITON_INTERPRET=1 must be set before any test module
imports them. Without CUDA, compiled Triton cannot run at all, so interpreting is always right.
If another directory's tests imported triton before this conftest loaded, the interpreter tests
rerun themselves in a fresh process (see test_triton_interpret.py).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
