"""GPU benchmark: each Triton kernel vs its plain-torch reference vs torch.compile(reference).

    python bench/kernels_gpu.py [--seqs 2048,4096,8192] [--peak-gbs 2039] [--out bench/results/kernels_gpu]

Needs a CUDA GPU (exits with a message and status 0 otherwise). BLOOM-176B shapes per TP=4 rank,
bf16: LayerNorm over hidden 14336, bias+GeLU on [tokens, 4*14336/4], softmax on [28 heads, s, s],
attention with 28 heads of 128. For each op, forward and forward+backward times (median of
triton.testing.do_bench), and:
  - achieved bandwidth = minimum bytes an op must move (read inputs, write outputs; for backward
    also read saved tensors and write gradients) / time, as a fraction of the device's peak
    (spec sheet value for known GPUs, --peak-gbs to override) and of a measured copy bandwidth;
  - attention TFLOP/s, counting causal FLOPs (forward 2 matmuls of b*h*s*s*d MACs, halved by the
    mask; forward + backward = 3.5x forward, the FlashAttention convention).
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# HBM bandwidth from the vendors' spec sheets, GB/s (1e9 bytes/s)
PEAK_GBS = {"H200": 4800, "H100 SXM": 3350, "H100 PCIe": 2000, "H100": 3350, "A100-SXM4-80GB": 2039,
            "A100 80GB PCIe": 1935, "A100-SXM4-40GB": 1555, "A100": 1555, "L40S": 864, "A10": 600}


def _peak_gbs(name: str, override: float | None) -> float | None:
    if override:
        return override
    for key, value in PEAK_GBS.items():  # most specific names first
        if key in name:
            return value
    return None


def _bench_ms(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def _copy_gbs() -> float:
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def _fwd_bwd(fn, inputs, grad):
    def run():
        for t in inputs:
            t.grad = None
        fn(*inputs).backward(grad)
    return run


def _impls(reference, triton_fn):
    import torch

    return {"triton": triton_fn, "reference": reference,
            "compiled_reference": torch.compile(reference, dynamic=False)}


def bench_elementwise_ops(ops, tokens: int, results: list, peak: float | None, copy_gbs: float):
    """LayerNorm, bias+GeLU: bandwidth-bound; report GB/s and fractions of peak."""
    import torch

    from kernels.bias_gelu.reference import bias_gelu_reference
    from kernels.layer_norm.reference import layer_norm_reference

    hidden, ffn = 14336, 4 * 14336 // 4
    bf16 = torch.bfloat16
    x = torch.randn(tokens, hidden, device="cuda", dtype=bf16, requires_grad=True)
    w = torch.ones(hidden, device="cuda", dtype=bf16, requires_grad=True)
    b = torch.zeros(hidden, device="cuda", dtype=bf16, requires_grad=True)
    h = torch.randn(tokens, ffn, device="cuda", dtype=bf16, requires_grad=True)
    hb = torch.zeros(ffn, device="cuda", dtype=bf16, requires_grad=True)
    cases = {
        "layer_norm": (_impls(lambda x, w, b: layer_norm_reference(x, w, b, 1e-5),
                              lambda x, w, b: ops.layer_norm_triton(x, w, b, 1e-5)), [x, w, b],
                       2 * x.numel() * 2, 3 * x.numel() * 2),  # fwd: read x, write y; bwd: read x, dy, write dx
        "bias_gelu": (_impls(bias_gelu_reference, ops.bias_gelu_triton), [h, hb], 2 * h.numel() * 2, 3 * h.numel() * 2),
    }
    for name, (impls, inputs, fwd_bytes, bwd_bytes) in cases.items():
        grad = torch.randn_like(inputs[0])
        for impl, fn in impls.items():
            fwd_ms = _bench_ms(lambda fn=fn, inputs=inputs: fn(*inputs))
            both_ms = _bench_ms(_fwd_bwd(fn, inputs, grad))
            gbs = fwd_bytes / (fwd_ms * 1e-3) / 1e9
            gbs_both = (fwd_bytes + bwd_bytes) / (both_ms * 1e-3) / 1e9
            results.append({"op": name, "impl": impl, "shape": list(inputs[0].shape), "fwd_ms": fwd_ms,
                            "fwd_bwd_ms": both_ms, "fwd_gbs": gbs, "fwd_bwd_gbs": gbs_both,
                            "fwd_frac_peak": gbs / peak if peak else None, "fwd_frac_copy": gbs / copy_gbs,
                            "fwd_bwd_frac_peak": gbs_both / peak if peak else None})
            print(f"{name:20s} {impl:18s} fwd {fwd_ms:7.3f} ms ({gbs:6.0f} GB/s)  fwd+bwd {both_ms:7.3f} ms "
                  f"({gbs_both:6.0f} GB/s)", flush=True)


def bench_softmax(ops, s: int, results: list, peak: float | None, copy_gbs: float):
    import torch

    import kernels
    from kernels.softmax.reference import scale_mask_softmax_reference

    heads = 28
    scores = torch.randn(heads, s, s, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    alibi = (kernels.alibi_slopes(heads).cuda()[:, None, None] * torch.arange(s, device="cuda")).bfloat16()
    grad = torch.randn_like(scores)
    impls = _impls(lambda x: scale_mask_softmax_reference(x, 0.088, alibi),
                   lambda x: ops.scale_mask_softmax_triton(x, 0.088, alibi))
    nbytes = scores.numel() * 2
    for impl, fn in impls.items():
        fwd_ms = _bench_ms(lambda fn=fn: fn(scores))
        both_ms = _bench_ms(_fwd_bwd(fn, [scores], grad))
        gbs, gbs_both = 2 * nbytes / (fwd_ms * 1e-3) / 1e9, 5 * nbytes / (both_ms * 1e-3) / 1e9
        results.append({"op": "scale_mask_softmax", "impl": impl, "shape": [heads, s, s], "fwd_ms": fwd_ms,
                        "fwd_bwd_ms": both_ms, "fwd_gbs": gbs, "fwd_bwd_gbs": gbs_both,
                        "fwd_frac_peak": gbs / peak if peak else None, "fwd_frac_copy": gbs / copy_gbs,
                        "fwd_bwd_frac_peak": gbs_both / peak if peak else None})
        print(f"softmax s={s:5d}       {impl:18s} fwd {fwd_ms:7.3f} ms ({gbs:6.0f} GB/s)  fwd+bwd {both_ms:7.3f} ms",
              flush=True)
        torch.cuda.empty_cache()


def bench_attention(ops, s: int, results: list, max_materialized: int):
    import torch

    import kernels
    from kernels.attention.reference import attention_reference

    b, h, d = 1, 28, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    slopes = kernels.alibi_slopes(h).cuda()
    grad = torch.randn_like(q)
    fwd_flops = 4 * b * h * s * s * d / 2  # QK^T and PV, causal half
    impls = _impls(lambda q, k, v: attention_reference(q, k, v, slopes),
                   lambda q, k, v: ops.attention_triton(q, k, v, slopes))
    for impl, fn in impls.items():
        if impl != "triton" and s > max_materialized:
            continue
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_ms = _bench_ms(lambda fn=fn: fn(q, k, v))
        both_ms = _bench_ms(_fwd_bwd(fn, [q, k, v], grad))
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        results.append({"op": "attention", "impl": impl, "shape": [b, h, s, d], "fwd_ms": fwd_ms,
                        "fwd_bwd_ms": both_ms, "fwd_tflops": fwd_flops / (fwd_ms * 1e-3) / 1e12,
                        "fwd_bwd_tflops": 3.5 * fwd_flops / (both_ms * 1e-3) / 1e12, "peak_extra_mb": peak_mb})
        r = results[-1]
        print(f"attention s={s:5d}     {impl:18s} fwd {fwd_ms:7.3f} ms ({r['fwd_tflops']:5.1f} TFLOP/s)  fwd+bwd "
              f"{both_ms:7.3f} ms ({r['fwd_bwd_tflops']:5.1f} TFLOP/s)  peak +{peak_mb:.0f} MiB", flush=True)
        torch.cuda.empty_cache()


def write_markdown(path: Path, result: dict) -> None:
    lines = ["# Kernels GPU benchmark", "", f"{result['device']}; peak {result['peak_gbs']} GB/s (spec), "
             f"copy {result['copy_gbs']:.0f} GB/s (measured)", "",
             "| op | impl | shape | fwd ms | fwd+bwd ms | fwd GB/s (frac of peak) | TFLOP/s fwd / fwd+bwd |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        bw = f"{r['fwd_gbs']:.0f} ({r['fwd_frac_peak']:.2f})" if r.get("fwd_frac_peak") else f"{r.get('fwd_gbs', 0):.0f}"
        tf = f"{r['fwd_tflops']:.1f} / {r['fwd_bwd_tflops']:.1f}" if "fwd_tflops" in r else ""
        lines.append(f"| {r['op']} | {r['impl']} | {r['shape']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | "
                     f"{bw if 'fwd_gbs' in r else ''} | {tf} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", default="2048,4096,8192", help="comma-separated sequence lengths")
    parser.add_argument("--tokens", type=int, default=8192, help="rows for LayerNorm and bias+GeLU")
    parser.add_argument("--peak-gbs", type=float, default=None, help="device peak memory bandwidth, GB/s")
    parser.add_argument("--max-materialized-seq", type=int, default=8192,
                        help="skip the s x s reference attention above this length")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kernels_gpu"),
                        help="output path without extension (.json and .md are written)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("kernels_gpu: no CUDA GPU on this machine; nothing to benchmark. Run it on a GPU node "
              "(bench/kernels_cpu.py covers the CPU).")
        return 0
    try:
        import triton  # noqa: F401
    except ImportError:
        print("kernels_gpu: triton is not installed; install it to benchmark the Triton kernels.")
        return 0
    from kernels import dispatch

    ops = dispatch.triton_ops("cuda")
    name = torch.cuda.get_device_name(0)
    peak = _peak_gbs(name, args.peak_gbs)
    copy_gbs = _copy_gbs()
    rows: list[dict] = []
    result = {"device": name, "peak_gbs": peak, "copy_gbs": copy_gbs, "torch": torch.__version__,
              "triton": triton.__version__, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every section: a run stopped at its time limit keeps what it measured
        out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
        write_markdown(out.with_suffix(".md"), result)

    bench_elementwise_ops(ops, args.tokens, rows, peak, copy_gbs)
    write()
    for s in (int(x) for x in args.seqs.split(",")):
        bench_softmax(ops, s, rows, peak, copy_gbs)
        bench_attention(ops, s, rows, args.max_materialized_seq)
        write()
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
