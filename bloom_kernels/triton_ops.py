"""The Triton implementations of every op, gathered for the dispatcher.

Imported lazily by `bloom_kernels.dispatch.triton_ops()` (never by `import bloom_kernels`), because importing
triton is slow and because TRITON_INTERPRET must be decided before the kernels are defined.
"""

from bloom_kernels._triton_common import INTERPRETED
from bloom_kernels.attention.triton_impl import attention_triton
from bloom_kernels.bias_gelu.triton_impl import bias_gelu_triton
from bloom_kernels.layer_norm.triton_impl import layer_norm_triton
from bloom_kernels.softmax.triton_impl import scale_mask_softmax_triton

__all__ = ["INTERPRETED", "attention_triton", "bias_gelu_triton", "layer_norm_triton",
           "scale_mask_softmax_triton"]
