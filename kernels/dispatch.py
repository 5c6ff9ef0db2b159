"""The one place that decides which implementation of a fused op runs.

Paths:
  reference  plain torch, the definition of every op (runs anywhere).
  triton     Triton kernels. On CUDA tensors they are compiled; on CPU tensors they run under
             Triton's interpreter (TRITON_INTERPRET=1), which is how the tests exercise them.

Choice, highest priority first:
  1. the environment variable BLOOM_KERNELS (auto|reference|triton), so an operator can flip the
     path of an existing config without editing it;
  2. set_kernel_path(...), which the trainer calls with the config field `model.kernels`;
  3. "auto": triton for CUDA tensors when triton imports, reference otherwise.

Attention has a second knob because on CPU there are two plain-torch paths: the materialised
reference (builds the s x s matrix) and the chunked, memory-linear one (flash algorithm in torch):
  BLOOM_ATTENTION env var > set_attention_impl(...) > "auto"
  auto: follow the kernel path (triton -> flash Triton kernel, reference -> materialised).

TRITON_INTERPRET: triton decides compiled vs interpreted when a `@triton.jit` function is
*defined*: triton.language's helpers when triton is first imported, ours when our kernel modules
are first imported (lazily, on the first call that needs them). So to run the kernels on CPU
tensors, TRITON_INTERPRET=1 must be in the environment before anything imports triton (careful:
transformers and deepspeed do). If nothing has imported triton yet, the first Triton call on CPU
tensors sets it; otherwise it is an error that names the fix. A process cannot both compile the
kernels for a GPU and interpret them for CPU tensors.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import torch

logger = logging.getLogger("kernels")

KERNEL_PATHS = ("auto", "reference", "triton")
ATTENTION_IMPLS = ("auto", "materialized", "chunked")
ENV_KERNELS = "BLOOM_KERNELS"
ENV_ATTENTION = "BLOOM_ATTENTION"

_configured_path = "auto"
_configured_attention = "auto"
_logged_decisions: set[tuple[str, ...]] = set()
_triton_ops: ModuleType | None = None


def _validate(value: str, allowed: tuple[str, ...], what: str) -> str:
    value = value.strip().lower()
    if value not in allowed:
        raise ValueError(f"{what} = {value!r} is not allowed; use one of {', '.join(allowed)}")
    return value


def set_kernel_path(path: str) -> None:
    """Set the configured path (config field `model.kernels`). BLOOM_KERNELS still overrides it."""
    global _configured_path
    _configured_path = _validate(path, KERNEL_PATHS, "model.kernels")


def set_attention_impl(impl: str) -> None:
    """Set the attention implementation (auto|materialized|chunked). BLOOM_ATTENTION overrides it."""
    global _configured_attention
    _configured_attention = _validate(impl, ATTENTION_IMPLS, "attention implementation")


def requested_path() -> str:
    """The path asked for (auto|reference|triton), env var first, before looking at any tensor."""
    env = os.environ.get(ENV_KERNELS)
    if env:
        return _validate(env, KERNEL_PATHS, f"environment variable {ENV_KERNELS}")
    return _configured_path


def triton_available() -> bool:
    """True when the triton package can be imported (it is optional)."""
    # never `import triton` here: that would fix its compiled/interpreted mode (see module doc)
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def current_path(device_type: str | None = None) -> str:
    """The path ops run on for tensors of `device_type` ('cuda'/'cpu'; default: cuda if present)."""
    device_type = device_type or _default_device_type()
    requested = requested_path()
    if requested == "reference":
        return "reference"
    if requested == "triton":
        if not triton_available():
            raise RuntimeError(
                f"kernel path 'triton' was requested ({ENV_KERNELS} or model.kernels) but triton "
                "cannot be imported: install triton, or use 'auto'/'reference'"
            )
        return "triton"
    return "triton" if device_type == "cuda" and triton_available() else "reference"


def current_attention_impl(device_type: str | None = None) -> str:
    """'materialized', 'chunked' or 'triton' for tensors of `device_type`."""
    env = os.environ.get(ENV_ATTENTION)
    impl = _validate(env, ATTENTION_IMPLS, ENV_ATTENTION) if env else _configured_attention
    if impl != "auto":
        return impl
    return "triton" if current_path(device_type) == "triton" else "materialized"


def _log_once(*decision: str) -> None:
    if decision not in _logged_decisions:
        _logged_decisions.add(decision)
        logger.info("kernels: %s", ", ".join(decision))


def path_for(tensor: torch.Tensor) -> str:
    """Resolve the path for one op call on `tensor`, logging the decision the first time."""
    path = current_path(tensor.device.type)
    _log_once(f"device={tensor.device.type}", f"path={path}", f"requested={requested_path()}")
    return path


def attention_impl_for(tensor: torch.Tensor) -> str:
    impl = current_attention_impl(tensor.device.type)
    _log_once(f"device={tensor.device.type}", f"attention={impl}")
    return impl


def triton_ops(device_type: str) -> ModuleType:
    """Import (once) and return `kernels.triton_ops`, arranging interpretation for CPU tensors."""
    global _triton_ops
    if _triton_ops is None:
        if device_type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            if "triton" in sys.modules:  # too late: triton.language is already compiled-mode
                raise RuntimeError(
                    f"the Triton kernels cannot run on {device_type} tensors in this process: triton was "
                    "imported without TRITON_INTERPRET=1 (transformers and deepspeed import it). Start "
                    "the process with TRITON_INTERPRET=1 in its environment, or use the reference path"
                )
            logger.warning("kernels: triton on %s tensors: setting TRITON_INTERPRET=1 (slow)", device_type)
            os.environ["TRITON_INTERPRET"] = "1"
        _triton_ops = importlib.import_module("kernels.triton_ops")
    if device_type != "cuda" and not _triton_ops.INTERPRETED:
        raise RuntimeError(
            "the Triton kernels were compiled for the GPU in this process, so they cannot run on "
            f"{device_type} tensors; run CPU Triton checks in a separate process started with "
            "TRITON_INTERPRET=1, or move the tensors to CUDA"
        )
    return _triton_ops


@contextlib.contextmanager
def kernel_path(path: str, attention: str | None = None) -> Iterator[None]:
    """Temporarily run on `path` (and attention impl), restoring the previous settings after.

    Used by tests that run the same model on both paths. The env vars, if set, are cleared for the
    duration so that the requested path really is used.
    """
    global _configured_path, _configured_attention
    saved = (_configured_path, _configured_attention)
    saved_env = {k: os.environ.pop(k) for k in (ENV_KERNELS, ENV_ATTENTION) if k in os.environ}
    try:
        set_kernel_path(path)
        if attention is not None:
            set_attention_impl(attention)
        yield
    finally:
        _configured_path, _configured_attention = saved
        os.environ.update(saved_env)
