"""Shared pieces of the Triton kernels. Imported only when a Triton path is used.

Interpreter caveats found with triton 3.9 (TRITON_INTERPRET=1, CPU tensors), and the workarounds:
- `tl.dot` on bf16 operands returns garbage (numpy has no bf16; values ~1e10). Kernels take a
  DOT_FP32 constexpr, set when interpreting, that upcasts dot operands to fp32. Compiled GPU
  kernels keep bf16 operands (tensor cores) with fp32 accumulation.
- `libdevice.tanh` is not implemented by the interpreter; `tanh_f32` below uses exp instead.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton import knobs

# triton decides compiled vs interpreted per @triton.jit function when it is defined, and
# triton.language's own helpers (tl.sum, tl.max, ...) are defined when triton is first imported.
# So TRITON_INTERPRET must be set before the first `import triton` in the process: if it was set
# later, our kernels would be interpreted but tl.sum compiled, which cannot run.
INTERPRETED: bool = bool(knobs.runtime.interpret)
LANGUAGE_INTERPRETED: bool = type(tl.sum).__name__ == "InterpretedFunction"
if INTERPRETED != LANGUAGE_INTERPRETED:
    raise RuntimeError(
        f"TRITON_INTERPRET={'1' if INTERPRETED else 'unset'} now, but triton was first imported with "
        f"TRITON_INTERPRET={'1' if LANGUAGE_INTERPRETED else 'unset'} (something imported triton earlier: "
        "transformers and deepspeed do). Set TRITON_INTERPRET=1 in the environment before the "
        "process starts (or before anything imports triton) to run the Triton kernels on CPU."
    )


@triton.jit
def tanh_f32(x):
    # tanh(x) = 2 / (1 + exp(-2x)) - 1; saturates correctly (exp overflow -> inf -> -1).
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, n))


def row_programs(rows: int, device_type: str) -> int:
    """How many programs share the rows of a reduction (dweight/dbias partial sums)."""
    if device_type == "cuda" and not INTERPRETED:
        import torch

        return min(rows, 4 * torch.cuda.get_device_properties(0).multi_processor_count)
    return min(rows, 4)  # the interpreter runs programs one after another: few and fat is faster
