"""A torch.profiler pass over a few training steps, summarised: what the step's time goes to.

The summary (markdown) lists the top kernels by device time (CUDA) or the top ops by CPU time
(CPU-only runs), with their share of the total, and a rough breakdown by kind from the names
(matmuls, our Triton kernels, other Triton/inductor kernels, optimizer, communication, copies).
"""

from __future__ import annotations

from pathlib import Path

# Our Triton kernels' function names (bloom_kernels/*/triton_impl.py), which name their CUDA kernels.
OUR_KERNEL_PREFIXES = ("_attn_fwd", "_attn_bwd", "_layer_norm_fwd", "_layer_norm_bwd", "_bias_gelu_fwd",
                       "_bias_gelu_bwd", "_softmax_fwd", "_softmax_bwd")
# name fragment -> kind; first match wins (lower-case). Heuristic: it reads kernel names.
KINDS = [
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_", "aten::mm", "aten::addmm",
                "aten::bmm", "aten::baddbmm", "aten::matmul")),
    ("flash/sdpa attention", ("flash", "fmha", "efficient_attention", "flex_attention")),
    ("other triton (inductor)", ("triton_",)),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("communication", ("nccl", "gloo", "all_reduce", "allreduce")),
    ("copies", ("memcpy", "memset", "copy_", "aten::to", "aten::_to_copy", "cat", "fill")),
]


def kind_of(name: str) -> str:
    if name.startswith(OUR_KERNEL_PREFIXES):
        return "our triton kernels"
    lower = name.lower()
    for kind, fragments in KINDS:
        if any(f in lower for f in fragments):
            return kind
    return "other"


def profile_steps(step, steps: int, gpu: bool):
    """Run `step()` `steps` times under torch.profiler; returns the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
            if gpu:
                torch.cuda.synchronize()
    return prof


def summarise(prof, gpu: bool, steps: int, top: int = 25) -> dict:
    """Top entries by self device time (gpu) or self CPU time, in ms per step, and totals by kind."""
    field = "self_device_time_total" if gpu else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, field, 0) > 0]
    total_us = sum(getattr(e, field) for e in events)
    rows = sorted(events, key=lambda e: getattr(e, field), reverse=True)
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + getattr(e, field) / 1e3 / steps
    return {"clock": "device (CUDA kernels)" if gpu else "CPU (ops)", "steps": steps,
            "total_ms_per_step": total_us / 1e3 / steps,
            "top": [{"name": e.key, "kind": kind_of(e.key), "calls_per_step": e.count / steps,
                     "ms_per_step": getattr(e, field) / 1e3 / steps, "share": getattr(e, field) / total_us}
                    for e in rows[:top]],
            "by_kind_ms_per_step": dict(sorted(by_kind.items(), key=lambda kv: -kv[1]))}


def write_summary(path: Path, summary: dict, title: str) -> None:
    lines = [f"# {title}", "", f"torch.profiler, {summary['steps']} steps; clock: {summary['clock']}; "
             f"total {summary['total_ms_per_step']:.2f} ms per step (self times).", "",
             "| kind (from names) | ms per step | share |", "| --- | ---: | ---: |"]
    total = summary["total_ms_per_step"] or 1.0
    lines += [f"| {kind} | {ms:.2f} | {ms / total:.1%} |" for kind, ms in summary["by_kind_ms_per_step"].items()]
    lines += ["", "| # | name | kind | calls per step | ms per step | share |", "| ---: | --- | --- | ---: | ---: | ---: |"]
    for i, row in enumerate(summary["top"], 1):
        name = row["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| {i} | `{name}` | {row['kind']} | {row['calls_per_step']:.0f} | {row['ms_per_step']:.3f} | "
                     f"{row['share']:.1%} |")
    path.write_text("\n".join(lines) + "\n")
