"""The host memory an async checkpoint snapshot needs per node, and `runctl plan` refusing a layout
whose snapshot would not fit (exit 3, with the numbers and the ways out)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.cli.main import main
from orchestrator.plan.config import parse_config
from orchestrator.plan.planner import plan_run
from tests.unit.test_planner import _bloom_with

GIB = 1024**3
H = 14336
# BLOOM-176B at tp=4, pp=12, dp=8. The biggest stage is the last: 5 blocks + the tied embedding
# (with its LayerNorm) + the final LayerNorm, split over tp=4 (the planner rounds params / tp up):
#   block 12h^2 + 13h = 2,466,250,752 + 186,368 = 2,466,437,120; x 5 = 12,332,185,600
#   embedding 250880 h + 2h = 3,596,615,680 + 28,672 = 3,596,644,352; final LayerNorm 2h = 28,672
#   (12,332,185,600 + 3,596,644,352 + 28,672) / 4 = 15,928,858,624 / 4 = 3,982,214,656
PARAMS_PER_GPU = 3_982_214_656
# What one rank writes: bf16 weights 2 B + (fp32 master + Adam m, v) 12 B / dp=8 = 3.5 B per parameter.
SNAPSHOT_PER_RANK = 13_937_751_296  # 3,982,214,656 * 3.5 B = 12.98 GiB
# 8 ranks per node, + 25% margin: 13,937,751,296 * 8 * 1.25 = 139,377,512,960 B = 129.805 GiB.
NEEDED_PER_NODE = 139_377_512_960


def test_snapshot_host_memory_by_hand() -> None:
    plan = plan_run(parse_config(_bloom_with()))
    print(f"snapshot per rank {plan.snapshot_gib_per_rank:.4f} GiB (by hand {SNAPSHOT_PER_RANK / GIB:.4f}), "
          f"per node {plan.host_memory_needed_gib_per_node:.3f} GiB (by hand {NEEDED_PER_NODE / GIB:.3f})")
    assert plan.async_save and plan.fits
    assert abs(plan.snapshot_gib_per_rank * GIB - SNAPSHOT_PER_RANK) < 1024
    assert abs(plan.host_memory_needed_gib_per_node * GIB - NEEDED_PER_NODE) < 8 * 1024
    assert abs(plan.host_memory_needed_gib_per_node - 129.80) < 0.01


def test_plan_refuses_a_snapshot_that_does_not_fit(tmp_path: Path, capsys) -> None:
    small = tmp_path / "small-host.yaml"
    small.write_text(yaml.safe_dump(_bloom_with(cluster__host_memory_gib=128)))  # 129.8 GiB needed
    assert main(["plan", str(small)]) == 3
    out = capsys.readouterr().out
    assert "129.8 GiB per node" in out and "13.0 GiB per rank x 8 ranks" in out and "= 128" in out, out
    assert "async_save: false" in out and "raise pp or tp" in out
    # the same node with synchronous saves: nothing to snapshot, it fits
    sync = tmp_path / "sync.yaml"
    sync.write_text(yaml.safe_dump(_bloom_with(cluster__host_memory_gib=128, checkpoint__async_save=False)))
    assert main(["plan", str(sync)]) == 0
    # twice the pipeline stages: half the state per rank, it fits again
    deeper = tmp_path / "deeper.yaml"
    deeper.write_text(yaml.safe_dump(_bloom_with(cluster__host_memory_gib=128, parallel__pp=24, parallel__dp=4)))
    capsys.readouterr()
    main(["plan", str(deeper)])
    assert "async_save" not in capsys.readouterr().out
