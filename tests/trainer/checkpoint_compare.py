"""Compare two checkpoint directories file by file, every value of every .pt (tests only).

Tensors must be bit-identical (torch.equal, same dtype and shape); numpy arrays array_equal; any
other value ==. Nothing is skipped: DeepSpeed's model-states files carry our client state (step,
samples, schedules), the engine counters and the DeepSpeed config; `rng/rank-N.pt` carry each
rank's python/numpy/torch RNG state; the ZeRO files each DP rank's fp32 partition and Adam moments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

MANIFEST = "MANIFEST.json"  # differs by its creation time and is checked by verify_manifest instead


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """{'.optimizer.state.0.exp_avg': tensor, ...}: every leaf of nested dicts/lists/tuples."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}.{key}"))
        return out
    if isinstance(obj, (list, tuple)):
        out = {}
        for i, value in enumerate(obj):
            out.update(flatten(value, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def checkpoint_files(ckpt_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(ckpt_dir)) for p in ckpt_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def compare_checkpoints(a_dir: Path, b_dir: Path) -> dict[str, int]:
    """Assert a_dir and b_dir hold the same files with identical contents; returns counts
    {"files", "tensors", "values", "rng_files"} of what was compared."""
    files = checkpoint_files(a_dir)
    assert files == checkpoint_files(b_dir), f"different files: {files} vs {checkpoint_files(b_dir)}"
    counts = {"files": 0, "tensors": 0, "values": 0, "rng_files": 0}
    differ: list[str] = []
    worst = 0.0
    for rel in files:
        if not rel.endswith(".pt"):
            assert (a_dir / rel).read_bytes() == (b_dir / rel).read_bytes(), rel
            continue
        a = flatten(torch.load(a_dir / rel, map_location="cpu", weights_only=False))
        b = flatten(torch.load(b_dir / rel, map_location="cpu", weights_only=False))
        assert a.keys() == b.keys(), f"{rel}: keys differ: {sorted(set(a) ^ set(b))[:10]}"
        counts["files"] += 1
        counts["rng_files"] += rel.startswith("rng/")
        for key in a:
            counts["tensors" if torch.is_tensor(a[key]) else "values"] += 1
            if not same(a[key], b[key]):
                differ.append(f"{rel}{key}")
                if torch.is_tensor(a[key]) and torch.is_tensor(b[key]) and a[key].shape == b[key].shape \
                        and a[key].is_floating_point():
                    worst = max(worst, (a[key].double() - b[key].double()).abs().max().item())
    print(f"compared {counts}; {len(differ)} differ, max abs difference {worst}")
    assert not differ, f"{len(differ)} values differ, e.g. {differ[:8]}"
    return counts
