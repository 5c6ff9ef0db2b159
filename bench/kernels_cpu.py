"""CPU benchmark of the fused-op references and of the two CPU attention paths.

    python bench/kernels_cpu.py [--seqs 512,1024,2048,4096,8192] [--out bench/results/kernels_cpu]

For each sequence length s it measures, forward + backward:
  layer_norm          reference, x [s, 1024] bf16
  bias_gelu           reference, x [s, 4096] bf16
  scale_mask_softmax  reference, scores [1 head, s, s] bf16 (s x s by definition)
  attention           materialised reference vs chunked (flash algorithm in torch),
                      q/k/v [1, 1, s, 64] fp32 (CPU bf16 matmuls are slower than fp32 here)
  model step          trainer.model.BloomModel, 1 layer, hidden 128, 2 heads of 64, vocab 256, LM
                      loss, kernels on the reference path, with each attention path
                      (materialised = scale_mask_softmax on s x s scores; chunked = flash in torch)
and writes <out>.json and <out>.md.

What "peak memory" means here: the growth of the process's peak resident set size (VmHWM, reset
through /proc/self/clear_refs before each run) over the resident size just before the run, i.e.
the extra RAM the forward + backward needed, inputs excluded, outputs and gradients included. To
make freed tensors really leave the process (so a later peak is not hidden in the allocator's free
lists), the script re-executes itself with MALLOC_MMAP_THRESHOLD_=65536: every tensor above 64 KiB
is its own mmap and returns to the OS when freed. It is Linux-only; elsewhere memory is reported
as null. "saved_mb" is exact and allocator-independent: bytes autograd keeps for backward.
Times are wall-clock medians (first run excluded when repeats > 1) on a possibly busy machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


def _reexec_with_fixed_mmap_threshold() -> None:
    if os.environ.get(MMAP_ENV) is None and sys.platform.startswith("linux"):
        os.environ[MMAP_ENV] = "65536"
        os.execv(sys.executable, [sys.executable, *sys.argv])


def _status_kb(field: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"{field}:\s+(\d+) kB", text)
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5 = reset the peak RSS (VmHWM)
        return True
    except OSError:
        return False


def measure(fn, repeats: int) -> dict:
    """Run `fn` (forward + backward) `repeats` times: peak extra RSS of the first run, median time."""
    import torch

    gc.collect()
    rss_before = _status_kb("VmRSS")
    can_reset = _reset_peak()
    start = time.perf_counter()
    fn()
    times = [time.perf_counter() - start]
    peak = _status_kb("VmHWM")
    for _ in range(repeats - 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(backward=False)
    peak_mb = (peak - rss_before) / 1024 if (can_reset and peak and rss_before) else None
    steady = times[1:] if len(times) > 1 else times
    return {"time_s": round(statistics.median(steady), 4), "peak_rss_delta_mb": peak_mb and round(peak_mb, 1),
            "saved_mb": round(saved[0] / 2**20, 2)}


def _op_cases(s: int):
    """name -> fn(backward=True) running one forward (+ backward) at sequence length s."""
    import torch

    import bloom_kernels
    from bloom_kernels.attention.chunked import attention_chunked
    from bloom_kernels.attention.reference import attention_reference
    from bloom_kernels.bias_gelu.reference import bias_gelu_reference
    from bloom_kernels.layer_norm.reference import layer_norm_reference
    from bloom_kernels.softmax.reference import scale_mask_softmax_reference

    def leaf(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape) * scale).to(dtype).requires_grad_()

    x_ln, w_ln, b_ln = leaf(s, 1024), leaf(1024), leaf(1024)
    x_ge, b_ge = leaf(s, 4096), leaf(4096)
    scores, alibi = leaf(1, s, s, scale=3.0), (bloom_kernels.alibi_slopes(1)[:, None, None] * torch.arange(s)).bfloat16()
    qkv = [leaf(1, 1, s, 64, dtype=torch.float32) for _ in range(3)]
    slopes = bloom_kernels.alibi_slopes(1)

    def run(out_fn):
        def fn(backward=True):
            out = out_fn()
            if backward:
                out.float().sum().backward()
        return fn

    return {
        "layer_norm": run(lambda: layer_norm_reference(x_ln, w_ln, b_ln, 1e-5)),
        "bias_gelu": run(lambda: bias_gelu_reference(x_ge, b_ge)),
        "scale_mask_softmax": run(lambda: scale_mask_softmax_reference(scores, 0.125, alibi)),
        "attention_materialized": run(lambda: attention_reference(*qkv, slopes)),
        "attention_chunked": run(lambda: attention_chunked(*qkv, slopes)),
    }


def _bloom_model_step_cases(s: int):
    """The real `trainer.model.BloomModel` (1 layer, hidden 128, 2 heads of 64, vocab 256), one
    forward + backward of the LM loss on [1, s] tokens, per attention path."""
    import torch

    import bloom_kernels
    from orchestrator.plan.config import parse_config
    from trainer.model import BloomModel, bloom_loss

    cfg = parse_config({
        "name": "kernels-bench", "seed": 0,
        "cluster": {"nodes": 1, "gpus_per_node": 1, "accelerator": "cpu"},
        "model": {"num_layers": 1, "hidden_size": 128, "num_attention_heads": 2, "seq_length": s,
                  "vocab_size": 256, "make_vocab_size_divisible_by": 8, "init_std": 0.02, "dtype": "fp32",
                  "kernels": "reference"},
        "parallel": {"tp": 1, "pp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 1,
                     "activation_checkpointing": False},
        "optimizer": {"lr": 1e-3},
        "data": {"datasets": [{"path": "unused"}], "tokenizer": "unused", "train_samples": 100},
        "checkpoint": {"interval_steps": 10},
    }, source="bench/kernels_cpu.py")
    torch.manual_seed(0)
    model = BloomModel(cfg).train()
    ids = torch.randint(0, 256, (1, s))

    def on(impl):
        def fn(backward=True):
            with bloom_kernels.kernel_path("reference", attention=impl):
                model.zero_grad(set_to_none=True)
                loss = bloom_loss(model(ids), torch.roll(ids, -1, 1))
                if backward:
                    loss.backward()
        return fn

    return {"model_step_materialized": on("materialized"), "model_step_chunked": on("chunked")}


def _model_step_cases(s: int):
    """The real model if trainer/ and orchestrator/ import; else a stand-in block (same sizes)."""
    try:
        return _bloom_model_step_cases(s)
    except Exception as exc:  # the benchmark of the kernels must not depend on the trainer working
        print(f"model step: trainer.model unavailable ({type(exc).__name__}: {exc}); using a stand-in block")
        return _standin_block_cases(s)


def _standin_block_cases(s: int):
    """A BLOOM-style block through the public `bloom_kernels` API, per attention path (used only when
    the real model cannot be built)."""
    import torch

    import bloom_kernels

    torch.manual_seed(0)
    hidden, heads, layers = 128, 2, 1
    head_dim = hidden // heads
    params = []
    for _ in range(layers):
        params.append({name: (torch.randn(*shape) * std).requires_grad_() for name, shape, std in [
            ("ln1_w", (hidden,), 0.0), ("ln1_b", (hidden,), 0.0), ("qkv", (hidden, 3 * hidden), 0.05),
            ("proj", (hidden, hidden), 0.05), ("ln2_w", (hidden,), 0.0), ("ln2_b", (hidden,), 0.0),
            ("fc1", (hidden, 4 * hidden), 0.05), ("fc1_b", (4 * hidden,), 0.0), ("fc2", (4 * hidden, hidden), 0.05)]})
    for p in params:
        with torch.no_grad():
            p["ln1_w"].fill_(1.0)
            p["ln2_w"].fill_(1.0)
    x0 = torch.randn(1, s, hidden)
    slopes = bloom_kernels.alibi_slopes(heads)

    def step(backward=True):
        x = x0
        for p in params:
            h = bloom_kernels.layer_norm(x, p["ln1_w"], p["ln1_b"], 1e-5)
            q, k, v = (h @ p["qkv"]).view(1, s, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            a = bloom_kernels.attention(q, k, v, slopes).transpose(1, 2).reshape(1, s, hidden)
            x = x + a @ p["proj"]
            h = bloom_kernels.layer_norm(x, p["ln2_w"], p["ln2_b"], 1e-5)
            x = x + bloom_kernels.bias_gelu(h @ p["fc1"], p["fc1_b"]) @ p["fc2"]
        if backward:
            x.pow(2).mean().backward()
        return x

    def on(impl):
        def fn(backward=True):
            with bloom_kernels.kernel_path("reference", attention=impl):
                step(backward)
        return fn

    return {"model_step_materialized": on("materialized"), "model_step_chunked": on("chunked")}


def _linearity(rows: list[dict], name: str) -> dict | None:
    """How peak memory grows with s: the ratio per doubling of s (2 = linear, 4 = quadratic), and
    the share of the s^2 term at the largest s in a least-squares fit peak = a + b*s + c*s^2
    (about 0 for a linear path, about 1 for one dominated by the s x s matrix)."""
    import numpy as np

    pts = sorted((r["seq"], r["peak_rss_delta_mb"]) for r in rows if r["op"] == name and r["peak_rss_delta_mb"])  # not a beat or event: a shape's sequence length
    ratios = [round(b[1] / a[1], 2) for a, b in zip(pts, pts[1:], strict=False) if b[0] == 2 * a[0] and a[1] > 0]
    if not ratios:
        return None
    item = {"op": name, "peak_ratio_per_doubling": ratios}
    if len(pts) >= 3:
        s, mb = np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts])
        coef, *_ = np.linalg.lstsq(np.stack([np.ones_like(s), s, s * s], axis=1), mb, rcond=None)
        item["quadratic_share_at_max_seq"] = round(float(coef[2] * s[-1] ** 2 / mb[-1]), 3)
    return item


def write_markdown(path: Path, result: dict) -> None:
    lines = ["# Kernels CPU benchmark", "", f"{result['machine']}", "",
             "peak = growth of peak RSS during forward+backward (see bench/kernels_cpu.py); "
             "saved = bytes autograd keeps for backward.", "",
             "| op | seq | time (s) | peak (MiB) | saved (MiB) |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['op']} | {r['seq']} | {r['time_s']:.3f} | {r['peak_rss_delta_mb']} | {r['saved_mb']} |")  # not a beat or event: a shape's sequence length
    lines += ["", "Peak-memory growth: ratio per doubling of s (2 = linear, 4 = quadratic), and the share of the "
              "s^2 term at the largest s in a fit a + b*s + c*s^2 (0 = linear, 1 = quadratic):", ""]
    lines += [f"- {item['op']}: {item['peak_ratio_per_doubling']}, s^2 share {item.get('quadratic_share_at_max_seq')}"
              for item in result["linearity"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", default="512,1024,2048,4096,8192", help="comma-separated sequence lengths")
    parser.add_argument("--max-materialized-seq", type=int, default=8192,
                        help="skip the s x s paths above this length (they need O(s^2) RAM)")
    parser.add_argument("--no-model-step", action="store_true", help="skip the model-step rows")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1 keeps timings stable on a shared machine)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kernels_cpu"),
                        help="output path without extension (.json and .md are written)")
    args = parser.parse_args(argv)
    _reexec_with_fixed_mmap_threshold()

    import torch

    torch.set_num_threads(args.threads)
    seqs = [int(s) for s in args.seqs.split(",")]
    quadratic = {"scale_mask_softmax", "attention_materialized", "model_step_materialized"}
    rows = []
    started = time.perf_counter()
    for s in seqs:
        cases = _op_cases(s)
        if not args.no_model_step:
            cases.update(_model_step_cases(s))
        for name, fn in cases.items():
            if name in quadratic and s > args.max_materialized_seq:
                continue
            if s == seqs[0]:
                fn()  # warm-up: one-time allocations (thread pools, kernels) are not the op's memory
            row = {"op": name, "seq": s, **measure(fn, repeats=2 if s <= 1024 else 1)}
            rows.append(row)
            print(f"{name:26s} s={s:5d}  {row['time_s']:8.3f} s  peak {row['peak_rss_delta_mb']} MiB  "
                  f"saved {row['saved_mb']} MiB", flush=True)
        del cases
    names = dict.fromkeys(r["op"] for r in rows)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}, "
                   f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} at the end",
        "memory_method": "peak RSS growth (VmHWM reset via /proc/self/clear_refs), MALLOC_MMAP_THRESHOLD_=65536",
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": rows,
        "linearity": [item for item in (_linearity(rows, n) for n in names) if item],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(out.with_suffix(".md"), result)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} in {result['wall_s']} s")
    for item in result["linearity"]:
        print(f"peak ratio per doubling, {item['op']}: {item['peak_ratio_per_doubling']}, "
              f"s^2 share {item.get('quadratic_share_at_max_seq')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
