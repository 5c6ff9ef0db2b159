"""The planner's BLOOM-176B numbers, and the planner refusing layouts that do not fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config, parse_config
from orchestrator.planner import count_parameters, pipeline_partition, plan_run

ROOT = Path(__file__).resolve().parents[2]
BLOOM = ROOT / "configs" / "bloom-176b.yaml"


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def test_bloom_176b_numbers() -> None:
    plan = plan_run(load_config(BLOOM))
    print(
        f"params {plan.parameters:,} gpus {plan.gpus} tokens/it {plan.tokens_per_iteration:,} "
        f"hw flops {plan.hardware_flops_per_iteration:.4e} s/it {plan.seconds_per_iteration:.2f} "
        f"gpu-h {plan.gpu_hours:,.0f} max mem {plan.max_memory_per_gpu_gib:.1f} GiB"
    )
    assert rel(plan.parameters, 176_247_271_424) <= 1e-4
    assert plan.gpus == 384 and (plan.tp, plan.pp, plan.dp) == (4, 12, 8)
    assert plan.tokens_per_iteration == 4_194_304
    assert rel(plan.hardware_flops_per_iteration, 6.02e18) <= 0.01
    tflops = plan.hardware_flops_per_iteration / (plan.gpus * plan.seconds_per_iteration) / 1e12
    assert abs(tflops - 149.8) < 0.05 and abs(plan.seconds_per_iteration - 104.7) < 0.05
    assert rel(plan.gpu_hours, 1.20e6) <= 0.01
    assert plan.max_memory_per_gpu_gib * 1024**3 < 80e9
    assert plan.fits and plan.micro_batches == 128
    assert abs(plan.bubble_fraction - 11 / 139) < 1e-12


def test_bloom_350b_tokens_gpu_hours() -> None:
    plan = plan_run(load_config(BLOOM), train_tokens=350e9)
    print(f"gpu-hours for 350B tokens: {plan.gpu_hours:,.0f}")
    assert rel(plan.gpu_hours, 0.93e6) <= 0.01


def test_parameter_count_matches_transformers_bloom_formula() -> None:
    # Independent count: transformers' BloomForCausalLM layout for BLOOM-176B, written out by hand.
    h, layers, vocab = 14336, 70, 250880
    per_layer = 2 * h + 3 * h * h + 3 * h + h * h + h + 2 * h + 4 * h * h + 4 * h + 4 * h * h + h
    expected = vocab * h + 2 * h + layers * per_layer + 2 * h
    assert count_parameters(load_config(BLOOM)) == expected == 176_247_271_424


def test_bloom_partition_is_72_units_over_12_stages() -> None:
    stages = pipeline_partition(70, 12)
    assert [layers for layers, _ in stages] == [5] + [6] * 10 + [5]
    assert [emb for _, emb in stages] == [True] + [False] * 10 + [True]


def test_young_daly_and_goodput_are_consistent() -> None:
    cfg = load_config(BLOOM)
    plan = plan_run(cfg, gpu_mtbf_hours=384 * 100, checkpoint_save_seconds=360)
    # tau = sqrt(2 * 0.1 h * 100 h) = sqrt(20) h
    assert abs(plan.optimal_checkpoint_interval_hours - 20**0.5) < 1e-9
    assert plan.optimal_goodput >= plan.expected_goodput
    assert 0 < plan.expected_goodput < 1


def _bloom_with(**changes) -> dict:
    data = yaml.safe_load(BLOOM.read_text())
    for path, value in changes.items():
        section, key = path.split("__")
        data[section][key] = value
    return data


def test_does_not_fit_without_recompute() -> None:
    plan = plan_run(parse_config(_bloom_with(parallel__activation_checkpointing=False)))
    assert not plan.fits
    assert any("enable activation_checkpointing" in p for p in plan.problems)


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "plan", str(BLOOM), "--json"],
        capture_output=True, text=True, check=True,
    )
    data = json.loads(out.stdout)
    for key in ("parameters", "gpus", "tp", "pp", "dp", "micro_batches", "tokens_per_iteration",
                "model_flops_per_iteration", "hardware_flops_per_iteration", "seconds_per_iteration",
                "gpu_hours", "max_memory_per_gpu_gib", "bubble_fraction", "checkpoint_interval_hours",
                "optimal_checkpoint_interval_hours", "expected_goodput"):
        assert key in data, key
    bad = tmp_path / "nofit.yaml"
    bad.write_text(yaml.safe_dump(_bloom_with(parallel__activation_checkpointing=False, cluster__gpu_memory_gib=40)))
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", str(bad)],
                         capture_output=True, text=True)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "does not fit" in res.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(_bloom_with(cluster__nodes=24)))
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", str(wrong)],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert "tp*pp*dp = 4*12*8 = 384, but the job has 24 nodes x 8 GPUs = 192" in res.stderr


@pytest.mark.parametrize("module", ["orchestrator.cli.main"])
def test_cli_never_imports_torch(module: str) -> None:
    code = (
        f"import sys, {module} as m; m.build_parser();"
        "bad = [x for x in ('torch', 'deepspeed', 'triton', 'numpy') if x in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
