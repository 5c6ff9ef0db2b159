"""bench/train_step_gpu.py on the CPU (--allow-cpu, tiny BLOOM): the same code path that measures the
step MFU on a GPU runs our step, transformers' BloomForCausalLM + AdamW at the same batch, and the
torch.profiler pass, and writes sane figures. The FLOP count is checked against torch's own
FlopCounterMode over a real forward + backward of transformers' model of that config."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT


def counted_flops_per_iteration(config: dict) -> int:
    """FLOPs torch counts for one iteration (every micro-batch) of transformers' BLOOM of `config`."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(vocab_size=config["vocab"], hidden_size=config["hidden"],
                                         n_layer=config["layers"], n_head=config["heads"]))
    tokens = torch.randint(0, config["vocab"], (config["micro_batch"], config["seq"]))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    return counter.get_total_flops() * config["grad_accum"]


def test_step_bench_reports_ours_beside_transformers_and_a_profile(tmp_path):
    out = tmp_path / "train_step.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "train_step_gpu.py"), "--allow-cpu",
                           "--out", str(out)], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    print(proc.stdout[-2500:], proc.stderr[-2500:])
    assert proc.returncode == 0
    record = json.loads(out.read_text())
    config = record["config"]
    flops = counted_flops_per_iteration(config)
    print(f"model FLOPs per iteration: script {record['model_flops_per_iteration']}, counted by torch {flops}")
    assert record["model_flops_per_iteration"] == flops
    ours, theirs = record["ours"], record["transformers"]
    assert ours["parameters"] == theirs["parameters"]  # the same model, two implementations
    for name, run in (("ours", ours), ("transformers", theirs)):
        step = run["step_seconds_median"]
        assert step > 0 and run["model_tflops"] == pytest.approx(flops / step / 1e12, rel=1e-9), name
        assert run["mfu"] is None  # no peak for a CPU: nothing pretends to be an MFU
        # both start at chance on random tokens: -log(1/V) (small init, logits near 0)
        print(name, "losses", run["losses"], "log V", math.log(config["vocab"]))
        assert all(abs(loss - math.log(config["vocab"])) < 0.25 for loss in run["losses"]), name
    assert record["speedup_vs_transformers"] == pytest.approx(theirs["step_seconds_median"] / ours["step_seconds_median"])
    assert {d["op"] for d in ours["kernel_decisions"]} >= {"layer_norm", "bias_gelu"}
    profile = record["profile"]
    summary = (tmp_path / "train_step_profile.md").read_text()
    print(summary[:1500])
    assert profile["top"] and profile["top"][0]["ms_per_step"] > 0
    assert sum(r["ms_per_step"] for r in profile["top"]) <= profile["total_ms_per_step"] * (1 + 1e-9)
    assert profile["by_kind_ms_per_step"]["matmul"] > 0
    assert summary.count("\n| ") >= 10 and profile["top"][0]["name"] in summary
