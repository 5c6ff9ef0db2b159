"""The one place that decides which implementation of a fused op runs.

Implementations (bloom_kernels/implementations.py): reference (plain torch, the definition of every op;
runs anywhere), triton (ours; compiled on CUDA tensors, interpreted on CPU tensors under
TRITON_INTERPRET=1, which is how the tests run them), compiled (torch.compile of the reference),
and for attention chunked (flash algorithm in torch), flex (FlexAttention) and sdpa (SDPA + bias).

Choice, highest priority first:
  1. attention only: the attention knob, when not auto (env BLOOM_ATTENTION > set_attention_impl,
     i.e. config `model.attention`): materialized (= reference), chunked, triton, flex, sdpa, compiled;
  2. the kernel path: env BLOOM_KERNELS (auto|reference|triton), so an operator can flip the path of
     an existing config without editing it, then set_kernel_path(...) (config `model.kernels`).
     reference or triton forces that implementation for every op;
  3. auto: the measured table (bloom_kernels/dispatch_table.json, read once; bloom_kernels/dispatch_table.py
     says what a row is): the fastest implementation not known to be incorrect that can run here,
     for this device, op, dtype, shape class and mode (fwd when autograd does not record the call,
     fwd_bwd when it does: training pays for both passes, eval only for the forward);
  4. fallback, when the table has no row for the device/shape or no timed candidate in it:
     triton on CUDA tensors when triton imports, reference otherwise (the choice before the table).
Each distinct decision is logged once (logger "bloom_kernels"), with the times it came from.

TRITON_INTERPRET: triton decides compiled vs interpreted when a `@triton.jit` function is
*defined*: triton.language's helpers when triton is first imported, ours when our kernel modules
are first imported (lazily, on the first call that needs them). So to run the kernels on CPU
tensors, TRITON_INTERPRET=1 must be in the environment before anything imports triton (careful:
transformers, deepspeed and torch.compile do). If nothing has imported triton yet, the first Triton
call on CPU tensors sets it; otherwise it is an error that names the fix. A process cannot both
compile the kernels for a GPU and interpret them for CPU tensors.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from bloom_kernels.dispatch_table import DEFAULT_TABLE, Row, Table, load_table, mode_of, size_class

logger = logging.getLogger("bloom_kernels")

KERNEL_PATHS = ("auto", "reference", "triton")
ATTENTION_IMPLS = ("auto", "materialized", "chunked", "triton", "flex", "sdpa", "compiled")
ENV_KERNELS = "BLOOM_KERNELS"
ENV_ATTENTION = "BLOOM_ATTENTION"

_configured_path = "auto"
_configured_attention = "auto"
_logged_decisions: set[tuple[str, ...]] = set()
_triton_ops: ModuleType | None = None
_table: Table | None = None
_table_path: Path = DEFAULT_TABLE
_device_names: dict[int, str] = {}


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
    """Set the attention implementation (see ATTENTION_IMPLS). BLOOM_ATTENTION overrides it."""
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
    """The attention knob for tensors of `device_type`; auto resolves to 'triton' (bloom_kernels.attention,
    where the table then decides per shape) or 'materialized' (the model's s x s path) by the kernel path."""
    impl = _attention_knob()
    if impl != "auto":
        return impl
    return "triton" if current_path(device_type) == "triton" else "materialized"


def use_table(table: Table | Path | str) -> None:
    """Follow `table` (a Table, or a table file to read) from now on instead of the committed one.
    For tests and for trying a fresh measurement; the trainer uses the committed table."""
    global _table, _table_path
    if isinstance(table, Table):
        _table = table
    else:
        _table_path, _table = Path(table), None
    _logged_decisions.clear()


def table() -> Table:
    """The table, read and validated on first use (a missing file is an empty table)."""
    global _table
    if _table is None:
        _table = load_table(_table_path)
    return _table


def device_key(tensor: torch.Tensor) -> str:
    """The table's device name: torch.cuda.get_device_name() for CUDA tensors, else the type."""
    if tensor.device.type != "cuda":
        return tensor.device.type
    index = tensor.device.index or 0
    if index not in _device_names:
        _device_names[index] = torch.cuda.get_device_name(index)
    return _device_names[index]


def unavailable(impl: str, device_type: str, mode: str) -> str | None:
    """Why `impl` cannot run here (None when it can): the table may name one this machine lacks."""
    if impl == "triton" and not triton_available():
        return "triton cannot be imported"
    if impl == "flex":
        if not _has_flex_attention():
            return f"torch {torch.__version__} has no FlexAttention (torch >= 2.5)"
        if device_type == "cpu" and mode == "fwd_bwd":
            return "FlexAttention has no backward on CPU"
    return None


@functools.cache
def _has_flex_attention() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def _attention_knob() -> str:
    env = os.environ.get(ENV_ATTENTION)
    return _validate(env, ATTENTION_IMPLS, ENV_ATTENTION) if env else _configured_attention


def _decided(op: str, tensors: tuple[torch.Tensor, ...], impl: str, why: str, row: Row | None = None) -> str:
    x = tensors[0]
    decision = (op, x.device.type, str(x.dtype), tuple(x.shape), impl, why)
    if decision not in _logged_decisions:
        _logged_decisions.add(decision)
        times = ", ".join(f"{name} {ms:.3f} ms" for ms, name in row.ranked()) if row else ""
        logger.info("kernels: %s on %s %s %s path=%s (%s%s)", op, x.device.type, str(x.dtype).removeprefix("torch."),
                    list(x.shape), impl, why, f": {times}; {row.source}" if row else "")
    return impl


def decisions() -> list[dict]:
    """The distinct decisions taken so far in this process: what ran, on what, and why."""
    keys = ("op", "device", "dtype", "shape", "impl", "why")
    return [dict(zip(keys, d, strict=True)) for d in sorted(_logged_decisions, key=str)]


def implementation_for(op: str, *tensors: torch.Tensor) -> str:
    """The implementation that runs `op` on these arguments (the tensors the op takes, first one
    first), by the priority order in the module docstring."""
    x = tensors[0]
    if op == "attention":
        knob = _attention_knob()
        if knob != "auto":
            return _decided(op, tensors, "reference" if knob == "materialized" else knob, f"attention={knob}")
    requested = requested_path()
    if requested != "auto":
        return _decided(op, tensors, current_path(x.device.type), f"requested={requested}")
    mode = mode_of(tensors)
    row = table().row(device_key(x), op, x.dtype, size_class(op, tensors), mode)
    impl = row.fastest_correct(lambda name: unavailable(name, x.device.type, mode)) if row else None
    if impl is not None:
        return _decided(op, tensors, impl, f"table, {mode}, size class {row.size_class}", row)
    why = "no timed row in the table" if row else "no row in the table for this device/shape"
    return _decided(op, tensors, current_path(x.device.type), f"fallback, {mode}: {why}")


def triton_ops(device_type: str) -> ModuleType:
    """Import (once) and return `bloom_kernels.triton_ops`, arranging interpretation for CPU tensors."""
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
        _triton_ops = importlib.import_module("bloom_kernels.triton_ops")
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
