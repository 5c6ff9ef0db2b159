"""Side-by-side kernel benchmark: every implementation the dispatch can pick, per op, at BLOOM's shapes.

    python bench/kernels_side_by_side.py [--budget-seconds 180] [--out bench/results/kernels_side_by_side]
                                         [--table bloom_kernels/dispatch_table.json]
    python bench/kernels_side_by_side.py --cpu-smoke --out DIR/name [--table DIR/table.json]

For each case of bench/kernel_cases.py (LayerNorm, bias+GeLU, scale+mask+ALiBi softmax, attention
with ALiBi) and each implementation of bloom_kernels/implementations.py: ours (triton), torch.compile of
the plain reference (compiled), the reference, and for attention the library paths a user would
pick, FlexAttention with an ALiBi score_mod (flex) and SDPA with an additive ALiBi bias (sdpa), plus
our torch flash algorithm (chunked):
  1. correctness first, against the plain-torch reference, forward (no autograd) and forward +
     backward, max error printed: bf16/fp32 tolerances of bloom_kernels/testing.py; bf16 attention by
     FlashAttention's criterion against an fp32 computation (bloom_kernels.testing.attention_bf16_bounds);
     fp32 attention and fp32 parameter gradients (sums over rows) 1e-4 relative, as
     tests/bloom_kernels/test_gpu.py. A candidate that fails is never timed and never chosen;
  2. then forward (under torch.no_grad) and forward+backward times: median of
     triton.testing.do_bench on a GPU; achieved GB/s (LayerNorm, GeLU, softmax: minimum bytes moved,
     bench/kernel_cases.py) or TFLOP/s (attention) and the fraction of the device's peak
     (bench/device_peaks.py, vendor data sheets).
Writes <out>.json and <out>.md after every case (a run stopped at its time limit keeps what it
measured), and merges one row per case and mode into the dispatch table (--table; on a GPU the
committed bloom_kernels/dispatch_table.json by default), which bloom_kernels/dispatch.py follows.

Without a GPU it says so and exits 0, unless --cpu-smoke: tiny fp32 shapes on the CPU, Triton under
TRITON_INTERPRET=1, torch.compile with the aot_eager backend (inductor's C++ build takes minutes on
2 cores), FlexAttention forward only ("unavailable on cpu" for its backward). Its numbers mean
nothing; it tests this script's whole path, and writes a table only where --table says.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.device_peaks import SOURCE as PEAKS_SOURCE  # noqa: E402
from bench.device_peaks import peak_bf16_tflops, peak_gbs  # noqa: E402
from bench.kernel_cases import CPU_SMOKE_CASES, GPU_CASES, Case, attention_flops, bytes_moved, make_inputs  # noqa: E402

MODES = ("fwd", "fwd_bwd")


def _time_ms(fn, device: str) -> float:
    if device == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    start = time.perf_counter()  # CPU smoke only: one run after the check's (its numbers mean nothing)
    fn()
    return (time.perf_counter() - start) * 1e3


def _run(fn, inputs, mode: str):
    """fwd: output under no_grad. fwd_bwd: (output, gradients of the leaves)."""
    import torch

    if mode == "fwd":
        with torch.no_grad():
            return fn(*inputs.args), []
    for t in inputs.leaves:
        t.grad = None
    out = fn(*inputs.args)
    out.backward(inputs.grad_out)
    return out.detach(), [t.grad.detach().clone() for t in inputs.leaves]


def _check(case: Case, inputs, fn, mode: str, expected, dtype) -> tuple[float, bool, str]:
    """(max error, correct, how it was judged) of one candidate in one mode against the reference."""
    import torch

    from bloom_kernels.testing import max_error, tolerance_check

    out, grads = _run(fn, inputs, mode)
    names = ["out", *(f"d{i}" for i in range(len(grads)))]
    results = []
    for index, (name, actual) in enumerate(zip(names, [out, *grads], strict=True)):
        if case.op == "attention" and dtype == torch.bfloat16:
            gold, bound = expected["bounds"][("out", "dq", "dk", "dv")[index]]
            err = max_error(actual, gold)
            results.append((err, err <= bound and not torch.isnan(actual).any().item(), f"{name} {err:.2e} <= {bound:.2e}"))
            continue
        ref = expected["out"] if index == 0 else expected["grads"][index - 1]
        # fp32: attention and parameter gradients (sums over rows) at 1e-4, as tests/bloom_kernels/test_gpu.py
        loose = dtype == torch.float32 and (case.op == "attention" or (index > 1 and case.op != "attention"))
        err, ok = tolerance_check(actual, ref, dtype, 1e-4 if loose else None)
        results.append((err, ok, f"{name} {err:.2e}"))
    return max(r[0] for r in results), all(r[1] for r in results), "; ".join(r[2] for r in results)


def _expected(case: Case, inputs, dtype) -> dict:
    import torch

    from bloom_kernels.implementations import REFERENCES
    from bloom_kernels.testing import attention_bf16_bounds

    out, grads = _run(REFERENCES[case.op], inputs, "fwd_bwd")
    expected = {"out": out, "grads": grads}
    if case.op == "attention" and dtype == torch.bfloat16:
        q, k, v, slopes = inputs.args[:4]
        expected["bounds"] = attention_bf16_bounds(q, k, v, inputs.grad_out, slopes)
    return expected


def _rate(case: Case, mode: str, ms: float, element_size: int, device_name: str, bf16: bool) -> dict:
    if case.op == "attention":
        flops = attention_flops(case)[MODES.index(mode)]
        tflops = flops / (ms * 1e-3) / 1e12
        peak = peak_bf16_tflops(device_name) if bf16 else None
        return {"tflops": tflops, "frac_peak": tflops / peak if peak else None}
    gbs = bytes_moved(case, element_size)[MODES.index(mode)] / (ms * 1e-3) / 1e9
    peak = peak_gbs(device_name)
    return {"gbs": gbs, "frac_peak": gbs / peak if peak else None}


def measure_case(case: Case, device: str, dtype, device_name: str) -> dict:
    """Check, then time, every implementation of the case's op; returns the case's record."""
    import torch

    from bloom_kernels import dispatch
    from bloom_kernels.dispatch_table import IMPLEMENTATIONS, size_class
    from bloom_kernels.implementations import implementation

    inputs = make_inputs(case, device, dtype)
    expected = _expected(case, inputs, dtype)
    record = {"op": case.op, "label": case.label, "shape": list(case.shape), "dtype": str(dtype).removeprefix("torch."),
              "size_class": size_class(case.op, inputs.tensors), "candidates": {}}
    for impl in IMPLEMENTATIONS[case.op]:
        cand = record["candidates"][impl] = {}
        for mode in MODES:
            result = cand[mode] = {"ms": None, "correct": None}
            why = dispatch.unavailable(impl, device, mode)
            if why:
                result["unavailable"] = f"unavailable on {device}: {why}"
                print(f"{case.op:18s} {str(case.shape):22s} {impl:9s} {mode:7s} {result['unavailable']}", flush=True)
                continue
            try:
                fn = implementation(case.op, impl, device)
                err, ok, how = _check(case, inputs, fn, mode, expected, dtype)
                result.update(correct=ok, max_error=err)
                print(f"{case.op:18s} {str(case.shape):22s} {impl:9s} {mode:7s} max error {err:.3e} "
                      f"{'ok' if ok else 'INCORRECT (not timed, never chosen)'} ({how})", flush=True)
                if ok:
                    result["ms"] = _time_ms(lambda fn=fn, mode=mode: _run(fn, inputs, mode), device)
                    result.update(_rate(case, mode, result["ms"], inputs.args[0].element_size(), device_name,
                                        dtype == torch.bfloat16))
                    print(f"{'':60s} {result['ms']:9.3f} ms  {_rate_text(result)}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is recorded, not fatal
                traceback.print_exc(limit=3)
                result["unavailable"] = f"failed on {device}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                if device == "cuda":
                    torch.cuda.empty_cache()
    if device == "cuda":
        torch.cuda.empty_cache()
    return record


def _rate_text(result: dict) -> str:
    if result.get("ms") is None:
        return result.get("unavailable", "incorrect" if result.get("correct") is False else "")
    value = f"{result['tflops']:.4g} TFLOP/s" if "tflops" in result else f"{result['gbs']:.4g} GB/s"
    return value + (f" ({result['frac_peak']:.2f} of peak)" if result.get("frac_peak") else "")


def table_rows(record: dict, device_name: str, source: str):
    """One dispatch-table row per mode of a measured case."""
    from bloom_kernels.dispatch_table import Row

    rows = []
    for mode in MODES:
        candidates = {}
        for impl, cand in record["candidates"].items():
            r = cand[mode]
            entry = {"ms": round(r["ms"], 5) if r["ms"] is not None else None, "correct": r["correct"]}
            if r.get("max_error") is not None:
                entry["max_error"] = float(f"{r['max_error']:.3e}")
            if r.get("unavailable"):
                entry["why"] = r["unavailable"]
            candidates[impl] = entry
        rows.append(Row(device=device_name, op=record["op"], dtype=record["dtype"], size_class=record["size_class"],
                        mode=mode, candidates=candidates, source=source, shape=tuple(record["shape"])))
    return rows


def write_markdown(path: Path, result: dict) -> None:
    lines = ["# Kernels side by side", "",
             f"{result['device']}, {result['dtype']}; peaks: {result['peak_gbs']} GB/s, {result['peak_bf16_tflops']} "
             f"TFLOP/s bf16 dense ({PEAKS_SOURCE}); torch {result['torch']}, triton {result['triton']}, compile backend "
             f"{result['compile_backend']}. Chosen = the fastest correct candidate (what bloom_kernels/dispatch.py runs).", "",
             "| op | case | shape | impl | correct (max error) | fwd ms | fwd rate | fwd+bwd ms | fwd+bwd rate | chosen |",
             "| --- | --- | --- | --- | --- | ---: | --- | ---: | --- | --- |"]
    for case in result["cases"]:
        for impl, cand in case["candidates"].items():
            fwd, both = cand["fwd"], cand["fwd_bwd"]
            judged = [r for r in (fwd, both) if r.get("correct") is not None]
            correct = ("yes" if all(r["correct"] for r in judged) else "NO") if judged else "-"
            err = max((r.get("max_error") or 0.0) for r in judged) if judged else None
            chosen = " + ".join(m for m in MODES if case.get("chosen", {}).get(m) == impl)
            ms = lambda r: f"{r['ms']:.3f}" if r["ms"] is not None else "-"  # noqa: E731
            lines.append(f"| {case['op']} | {case['label']} | {case['shape']} | {impl} | {correct}"
                         f"{f' ({err:.1e})' if err is not None else ''} | {ms(fwd)} | {_rate_text(fwd)} | {ms(both)} | "
                         f"{_rate_text(both)} | {chosen} |")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"| {name} | skipped: {why} | | | | | | | | |")
    path.write_text("\n".join(lines) + "\n")


def _copy_gbs() -> float:
    import torch

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _time_ms(lambda: dst.copy_(src), "cuda")
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny fp32 shapes on the CPU (tests the script)")
    parser.add_argument("--budget-seconds", type=float, default=180.0,
                        help="stop starting new cases after this long (the cases left are listed as skipped)")
    parser.add_argument("--out", default=None, help="output path without extension (.json and .md)")
    parser.add_argument("--table", default=None, help="dispatch table to merge the measured rows into")
    args = parser.parse_args(argv)
    if args.cpu_smoke:  # before anything imports triton or compiles (see bloom_kernels/dispatch.py)
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("BLOOM_COMPILE_BACKEND", "aot_eager")

    import torch

    from bloom_kernels.dispatch_table import DEFAULT_TABLE, merge_rows
    from bloom_kernels.implementations import compile_backend

    gpu = torch.cuda.is_available() and not args.cpu_smoke
    if not gpu and not args.cpu_smoke:
        print("kernels_side_by_side: no CUDA GPU here; nothing measured (--cpu-smoke tests the script on the CPU)")
        return 0
    device, dtype = ("cuda", torch.bfloat16) if gpu else ("cpu", torch.float32)
    cases = GPU_CASES if gpu else CPU_SMOKE_CASES
    device_name = torch.cuda.get_device_name(0) if gpu else "cpu"
    default_out = REPO / "bench" / "results" / "kernels_side_by_side" if gpu else \
        Path(tempfile.gettempdir()) / "kernels_side_by_side_cpu_smoke"
    out = Path(args.out) if args.out else default_out
    table_path = Path(args.table) if args.table else (DEFAULT_TABLE if gpu else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result = {"device": device_name, "dtype": str(dtype).removeprefix("torch."), "time": stamp,
              "torch": torch.__version__, "triton": triton_version, "compile_backend": compile_backend(),
              "peak_gbs": peak_gbs(device_name), "peak_bf16_tflops": peak_bf16_tflops(device_name),
              "peaks_source": PEAKS_SOURCE, "copy_gbs": _copy_gbs() if gpu else None, "cases": [], "skipped": {}}
    source = f"{device_name} {stamp[:10]} kernels_side_by_side"
    about = ("The measured table bloom_kernels/dispatch.py follows: per row the fastest candidate not known to be incorrect "
             "runs (row format: bloom_kernels/dispatch_table.py; how it decides and how to re-measure: docs/kernels.md). "
             "bench/kernels_side_by_side.py rewrites the rows it measures when run on a GPU.")
    description = (f"bench/kernels_side_by_side.py on {device_name}, {stamp} (torch {torch.__version__}, triton "
                   f"{triton_version}, compile backend {compile_backend()}), {result['dtype']}; every candidate checked "
                   f"against the reference before it was timed; "
                   f"{'medians of triton.testing.do_bench' if gpu else 'CPU smoke: the times mean nothing'}")
    started = time.monotonic()
    for case in cases:
        name = f"{case.op} {list(case.shape)}"
        if time.monotonic() - started > args.budget_seconds:
            result["skipped"][name] = f"out of time (--budget-seconds {args.budget_seconds:.0f})"
            print(f"skipped {name}: out of time", flush=True)
            continue
        record = measure_case(case, device, dtype, device_name)
        rows = table_rows(record, device_name, source)
        record["chosen"] = {row.mode: row.fastest_correct() for row in rows}
        result["cases"].append(record)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        write_markdown(out.with_suffix(".md"), result)
        if table_path is not None:
            merge_rows(table_path, rows, about, {source: description})
        print(f"{name}: chosen {record['chosen']} ({time.monotonic() - started:.0f} s so far)", flush=True)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}"
          + (f"; table rows merged into {table_path}" if table_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
