"""bench/kernels_side_by_side.py on the CPU: the whole script (--cpu-smoke), its table read back by
the dispatch, and a wrong candidate that is never timed nor chosen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from bloom_kernels import dispatch
from bloom_kernels.dispatch_table import IMPLEMENTATIONS, load_table
from tests.conftest import REPO_ROOT


def _fastest_correct(candidate: dict, mode: str, names) -> str:
    timed = [(candidate[n][mode]["ms"], n) for n in names
             if candidate[n][mode]["ms"] is not None and candidate[n][mode]["correct"]]
    return min(timed)[1]


def test_cpu_smoke_runs_the_whole_script_and_the_dispatch_follows_its_table(tmp_path, monkeypatch):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "kernels_side_by_side.py"), "--cpu-smoke",
                           "--out", str(tmp_path / "sbs"), "--table", str(tmp_path / "table.json")],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    assert proc.returncode == 0
    result = json.loads((tmp_path / "sbs.json").read_text())
    assert {c["op"] for c in result["cases"]} == set(IMPLEMENTATIONS) and not result["skipped"]
    table = load_table(tmp_path / "table.json")
    dispatch.use_table(table)
    try:
        for case in result["cases"]:
            assert set(case["candidates"]) == set(IMPLEMENTATIONS[case["op"]])
            for impl, cand in case["candidates"].items():
                for mode, r in cand.items():
                    # every candidate was judged or said why it could not run, and only correct ones were timed
                    assert r["correct"] is True or r.get("unavailable"), (case["op"], impl, mode, r)
                    assert (r["ms"] is not None) == (r["correct"] is True)
                    if r["correct"]:
                        print(case["op"], impl, mode, f"max error {r['max_error']:.2e}")
                        assert r["ms"] > 0 and r["max_error"] < 1e-4
            if case["op"] == "attention":  # torch has no FlexAttention backward on CPU: said, not crashed
                assert "unavailable on cpu" in case["candidates"]["flex"]["fwd_bwd"]["unavailable"]
            # the table written says what the JSON says, and the dispatch follows it
            shape = case["shape"]
            x = torch.zeros(shape)
            tensors = (x, torch.zeros(shape)) if case["op"] == "attention" else (x,)
            for mode in ("fwd", "fwd_bwd"):
                fastest = _fastest_correct(case["candidates"], mode, IMPLEMENTATIONS[case["op"]])
                assert case["chosen"][mode] == fastest
                x.requires_grad_(mode == "fwd_bwd")
                assert dispatch.implementation_for(case["op"], *tensors) == fastest, (case["op"], mode)
    finally:
        dispatch.use_table(dispatch.DEFAULT_TABLE)
    markdown = (tmp_path / "sbs.md").read_text()
    assert markdown.count("| attention |") == len(IMPLEMENTATIONS["attention"]) and "chosen" in markdown


def test_an_incorrect_candidate_is_never_timed_nor_chosen(monkeypatch):
    from bench import kernels_side_by_side as bench
    from bench.kernel_cases import CPU_SMOKE_CASES
    from bloom_kernels import implementations

    real = implementations.implementation

    def off_by_a_little(op, impl, device_type):  # compiled GeLU that is 0.1% off: beyond fp32 tolerance
        fn = real(op, impl, device_type)
        return (lambda *args: fn(*args) * 1.001) if impl == "compiled" else fn

    monkeypatch.setattr(implementations, "implementation", off_by_a_little)
    monkeypatch.setenv("BLOOM_COMPILE_BACKEND", "aot_eager")
    case = next(c for c in CPU_SMOKE_CASES if c.op == "bias_gelu")
    record = bench.measure_case(case, "cpu", torch.float32, "cpu")
    broken = record["candidates"]["compiled"]
    print({mode: (r["max_error"], r["correct"]) for mode, r in broken.items()})
    assert all(r["correct"] is False and r["ms"] is None for r in broken.values())
    assert record["candidates"]["reference"]["fwd_bwd"]["correct"] is True
    for row in bench.table_rows(record, "cpu", "test"):
        row.candidates["compiled"]["ms"] = 1e-9  # even if it had been timed fastest
        assert row.fastest_correct() != "compiled"
