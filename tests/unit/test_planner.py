"""The planner's BLOOM-176B numbers, and the planner refusing layouts that do not fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan.config import ConfigError, load_config, parse_config
from orchestrator.plan.planner import count_parameters, pipeline_partition, plan_run

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
    # Not a check of the throughput: 149.8 TFLOPs/GPU is an INPUT (cluster.achieved_tflops_per_gpu,
    # what BLOOM measured). Given it, an iteration of 6.0212e18 FLOPs on 384 GPUs takes
    # 6.0212e18 / (384 * 149.8e12) = 104.67 s, and the run 220e6 / 2048 = 107,421.875 iterations.
    assert abs(plan.seconds_per_iteration - 104.67) < 0.01
    assert rel(plan.gpu_hours, 107_421.875 * 104.67 * 384 / 3600) <= 1e-4
    assert rel(plan.gpu_hours, 1.20e6) <= 0.01
    assert plan.fits and plan.micro_batches == 128
    assert abs(plan.bubble_fraction - 11 / 139) < 1e-12


# Per-stage memory of BLOOM-176B (tp=4, pp=12, dp=8, micro-batch b=2, s=2048, h=14336, a=112,
# V=250880, full activation recompute), by hand:
H = 14336
SBH = 2048 * 2 * H  # s*b*h = 58,720,256
GIB = 1024**3
# Parameters of one block on one TP rank: the column/row-parallel matrices and the QKV / MLP-in
# biases are split 4 ways: (3h^2 + 3h) + h^2 + (4h^2 + 4h) + 4h^2 = 12h^2 + 7h; both LayerNorms
# (2h + 2h) and the biases of the row-parallel dense and MLP-out (h + h) are replicated: 6h.
BLOCK_PER_GPU = (12 * H * H + 7 * H) // 4 + 6 * H  # 616,562,688 + 1.75h + 6h = 616,673,792
# Word embedding, vocab-parallel (250880 / 4 rows each), plus its LayerNorm (2h, replicated).
EMBEDDING_PER_GPU = 250880 // 4 * H + 2 * H  # 899,153,920 + 28,672 = 899,182,592
# Bytes per parameter on a GPU, BF16_Optimizer under ZeRO-1 over dp = 8: bf16 weight 2 + bf16
# grad 2 + fp32 gradient-accumulation buffer 4 (not partitioned) + (fp32 master 4 + Adam m 4 +
# Adam v 4) / 8 = 8 + 1.5 = 9.5.
BYTES_PER_PARAM = 2 + 2 + 4 + 12 / 8
# Korthikanti et al. 2022, eq. 2 (tensor parallel t, no sequence parallelism), bytes per layer per
# micro-batch: s b h (10 + 24/t + 5 a s / (h t)) = sbh (10 + 6 + 5*112*2048 / (14336*4)) = 36 sbh.
# With full recompute a layer keeps only its bf16 input, 2 sbh, and one layer at a time holds
# its 36 sbh while its backward recomputes it.
FULL_LAYER = 36 * SBH  # 2,113,929,216 B
KEPT_LAYER = 2 * SBH  # 117,440,512 B


def test_bloom_stage_memory_by_hand() -> None:
    stages = plan_run(load_config(BLOOM)).stages
    # 1F1B: stage i has pp - i = 12 - i micro-batches in flight (128 micro-batches, so never fewer).
    # Stage 0: 5 blocks + the embedding, 12 in flight.
    params0 = 5 * BLOCK_PER_GPU + EMBEDDING_PER_GPU  # 3,083,368,960 + 899,182,592 = 3,982,551,552
    act0 = 5 * KEPT_LAYER * 12 + FULL_LAYER  # 7,046,430,720 + 2,113,929,216 = 9,160,359,936 B
    # Stage 1: 6 blocks, 11 in flight.
    params1 = 6 * BLOCK_PER_GPU  # 3,700,042,752
    act1 = 6 * KEPT_LAYER * 11 + FULL_LAYER  # 7,751,073,792 + 2,113,929,216 = 9,865,003,008 B
    act1_no_recompute = 6 * FULL_LAYER * 11  # 139,519,328,256 B = 129.94 GiB: why recompute is on
    # Stage 11: 5 blocks + the tied embedding + the final LayerNorm (2h), 1 in flight, plus the
    # micro-batch's vocab-parallel logits in fp32: 4 * s * b * V / t = 4 * 2048 * 2 * 62720.
    params11 = 5 * BLOCK_PER_GPU + EMBEDDING_PER_GPU + 2 * H  # 3,982,580,224
    act11 = 5 * KEPT_LAYER + FULL_LAYER + 4 * 2048 * 2 * 62720  # 2,701,131,776 + 1,027,604,480 B
    cases = [(stages[0], params0, act0, None), (stages[1], params1, act1, act1_no_recompute),
             (stages[11], params11, act11, None)]  # fmt: skip
    worst_params = 0.0
    for stage, params, act, act_no_recompute in cases:
        print(f"stage {stage.stage}: params/GPU {stage.parameters_per_gpu:,} (by hand {params:,}), activations "
              f"{stage.activations_gib:.4f} GiB (by hand {act / GIB:.4f}), total {stage.total_gib:.2f} GiB "
              f"(by hand {(params * BYTES_PER_PARAM + act) / GIB:.2f})")
        # The planner divides the replicated LayerNorm/bias vectors by tp as well: 4.5h fewer per
        # block, a relative 1e-4 of a stage. Activations have no such shortcut: exact.
        worst_params = max(worst_params, rel(stage.parameters_per_gpu, params))
        assert rel(stage.weights_bf16_gib * GIB, 2 * params) < 2e-4
        assert rel(stage.grads_bf16_gib * GIB, 2 * params) < 2e-4
        assert rel(stage.grad_accum_fp32_gib * GIB, 4 * params) < 2e-4
        assert rel(stage.optimizer_states_gib * GIB, 12 * params / 8) < 2e-4
        assert stage.activations_gib * GIB == act
        if act_no_recompute is not None:
            assert stage.activations_no_recompute_gib * GIB == act_no_recompute
        assert rel(stage.total_gib * GIB, params * BYTES_PER_PARAM + act) < 2e-4
    print(f"max relative error of the parameters per GPU: {worst_params:.2e}")
    assert worst_params < 2e-4
    # The biggest stage is the first: 3,982,551,552 * 9.5 + 9,160,359,936 = 46,994,599,680 B = 43.77 GiB.
    assert abs(max(s.total_gib for s in stages) - 46_994_599_680 / GIB) < 0.01


def test_activations_without_tp_or_recompute_by_hand() -> None:
    """Korthikanti et al.'s per-layer activations at t = 1: s b h (34 + 5 a s / h) bytes, and the
    optimizer state partitioned over a larger dp (ZeRO-1). BLOOM's model at tp=1, pp=12, dp=32."""
    cfg = parse_config(_bloom_with(parallel__tp=1, parallel__dp=32, parallel__rampup=None,
                                   parallel__activation_checkpointing=False))
    stage1 = plan_run(cfg).stages[1]
    # 34 + 5 * 112 * 2048 / 14336 = 34 + 80 = 114 sbh per layer; 6 layers, 11 micro-batches in flight.
    per_layer = SBH * 114  # 6,694,109,184 B
    assert stage1.activations_gib * GIB == 6 * per_layer * 11 == 441_811_206_144
    # Unsplit block (12h^2 + 13h = 2,466,437,120 parameters): exact at t = 1.
    params = 6 * (12 * H * H + 13 * H)
    assert stage1.parameters_per_gpu == params == 14_798_622_720
    assert stage1.optimizer_states_gib * GIB == 12 * params / 32
    assert stage1.grad_accum_fp32_gib * GIB == 4 * params


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
    # Synchronous saves: the stall is the whole save, tau = sqrt(2 * 0.1 h * 100 h) = sqrt(20) h.
    sync = parse_config(_bloom_with(checkpoint__async_save=False))
    plan = plan_run(sync, gpu_mtbf_hours=384 * 100, checkpoint_save_seconds=360)
    assert abs(plan.optimal_checkpoint_interval_hours - 20**0.5) < 1e-9
    assert plan.optimal_goodput >= plan.expected_goodput
    assert 0 < plan.expected_goodput < 1
    # Async saves stall for 3.6 s here (--snapshot-gb-per-second chosen so): tau = sqrt(2 * 0.001 * 100) h.
    plan = plan_run(load_config(BLOOM), gpu_mtbf_hours=384 * 100, checkpoint_save_seconds=360)
    snapshot = plan.snapshot_gib_per_rank * GIB / 1e9
    plan = plan_run(load_config(BLOOM), gpu_mtbf_hours=384 * 100, checkpoint_save_seconds=360,
                    snapshot_gb_per_second=snapshot / (3.6 - plan.probe_seconds))  # fmt: skip
    assert abs(plan.save_stall_seconds - 3.6) < 1e-9
    assert abs(plan.optimal_checkpoint_interval_hours - 0.2**0.5) < 1e-9


def test_async_save_stall_is_snapshot_bytes_over_bandwidth_by_hand() -> None:
    """BLOOM's async save stalls for the biggest stage's host copy at the config's bandwidth, plus the
    probe batch's forward through the pipeline; a sync save for the whole save."""
    cfg = load_config(BLOOM)
    plan = plan_run(cfg)
    # Stage 0 (the biggest): bf16 weights 2 B + its ZeRO-1 share of fp32 master and Adam 12 B / dp=8.
    params0 = 5 * BLOCK_PER_GPU + EMBEDDING_PER_GPU  # 3,982,551,552
    snapshot = params0 * (2 + 12 / 8)  # 13,938,930,432 B
    copy = snapshot / (cfg.checkpoint.snapshot_gb_per_second * 1e9)  # / 5.7 GB/s = 2.445 s
    # The probe: one micro-batch's forward through 12 stages in turn. With full recompute an
    # iteration is 4 forwards (hardware FLOPs 96 = 4 x 24), spread over 128 micro-batches per stage.
    probe = plan.seconds_per_iteration / 4 * 12 / 128  # 104.67 / 4 * 12 / 128 = 2.453 s
    print(f"stall {plan.save_stall_seconds:.4f} s (by hand {copy:.4f} + {probe:.4f} = {copy + probe:.4f}); "
          f"relative error {rel(plan.save_stall_seconds, copy + probe):.1e}")
    assert cfg.checkpoint.async_save and cfg.checkpoint.verify_probe
    assert rel(plan.snapshot_seconds, copy) < 2e-4  # the planner's LayerNorms / tp (test_bloom_stage_memory_by_hand)
    assert rel(plan.probe_seconds, probe) < 1e-12
    assert rel(plan.save_stall_seconds, copy + probe) < 2e-4
    no_probe = plan_run(parse_config(_bloom_with(checkpoint__verify_probe=False)))
    assert no_probe.probe_seconds == 0.0 and no_probe.save_stall_seconds == no_probe.snapshot_seconds
    sync = plan_run(parse_config(_bloom_with(checkpoint__async_save=False)))
    assert sync.save_stall_seconds == cfg.checkpoint.save_seconds


def test_retired_async_stall_fraction_is_dropped_with_a_warning_naming_its_replacement() -> None:
    """A run directory frozen before the key retired still loads (status, resume), with a warning."""
    from orchestrator.plan.config.load import RetiredKeyWarning

    with pytest.warns(RetiredKeyWarning) as caught:
        cfg = parse_config(_bloom_with(checkpoint__async_stall_fraction=0.1), source="run.yaml")
    message = str(caught[0].message)
    print(message)
    assert message.startswith("run.yaml: checkpoint.async_stall_fraction is replaced by checkpoint.snapshot_gb_per_second")
    assert "ignored" in message and not hasattr(cfg.checkpoint, "async_stall_fraction")
    assert plan_run(cfg).save_stall_seconds == plan_run(parse_config(_bloom_with())).save_stall_seconds
    with pytest.raises(ConfigError, match="checkpoint.async_stall_fractio: unknown key"):
        parse_config(_bloom_with(checkpoint__async_stall_fractio=0.1))


def test_runctl_plan_says_a_retired_key_in_one_line_and_plans(tmp_path: Path) -> None:
    old = tmp_path / "run.yaml"
    old.write_text(yaml.safe_dump(_bloom_with(checkpoint__async_stall_fraction=0.1)))
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", str(old), "--json"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith(f"runctl: warning: {old}: checkpoint.async_stall_fraction is replaced")
    assert json.loads(out.stdout)["save_stall_seconds"] > 0


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
