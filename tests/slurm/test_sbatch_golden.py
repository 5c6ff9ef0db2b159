"""The rendered job scripts: the recorded BLOOM script, and every shipped config renders and
passes `bash -n`.

Re-record the golden file after an intended template change, then review the diff:
    RECORD_GOLDEN=1 python -m pytest tests/slurm/test_sbatch_golden.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.slurm.render import render_sbatch

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "bloom-176b.sbatch"
GOLDEN_RUN_DIR = "/gpfsscratch/rech/six/commun/runs/tr11-176B-ml"
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_bloom_script_matches_the_recorded_file():
    text = render_sbatch(load_config(REPO / "configs" / "bloom-176b.yaml"), GOLDEN_RUN_DIR)
    if os.environ.get("RECORD_GOLDEN") == "1":
        GOLDEN.write_text(text)
        pytest.skip(f"re-recorded {GOLDEN}: review `git diff {GOLDEN.relative_to(REPO)}`")
    assert GOLDEN.exists(), f"no recorded script: RECORD_GOLDEN=1 pytest {__file__}"
    recorded = GOLDEN.read_text()
    if text != recorded:
        import difflib

        diff = "".join(
            difflib.unified_diff(recorded.splitlines(True), text.splitlines(True), "recorded", "rendered")
        )
        pytest.fail(f"the BLOOM script changed; if intended: RECORD_GOLDEN=1 pytest {__file__}\n{diff}")


def test_bloom_script_has_what_an_operator_expects():
    text = GOLDEN.read_text()
    sbatch = dict(
        (m.group(1), m.group(2) or "") for m in re.finditer(r"^#SBATCH --([a-z\-]+)(?:=(\S+))?$", text, re.M)
    )
    print(sbatch)
    # 48 nodes + BLOOM's 4 spares, held by one job that must outlive a failed node.
    assert sbatch["nodes"] == "52" and "no-kill" in sbatch
    assert sbatch["ntasks-per-node"] == "8" and sbatch["gres"] == "gpu:8"
    assert (
        sbatch["cpus-per-task"] == "8" and sbatch["time"] == "100:00:00" and sbatch["hint"] == "nomultithread"
    )
    assert (sbatch["partition"], sbatch["account"], sbatch["qos"]) == ("gpu_p5", "six", "qos_gpu-gc")
    assert "exclusive" in sbatch and sbatch["signal"] == "USR1@600" and sbatch["dependency"] == "singleton"
    assert sbatch["output"] == f"{GOLDEN_RUN_DIR}/jobs/slurm-%j.out"
    assert "export CUDA_LAUNCH_BLOCKING=1" in text
    # The launcher runs the trainer as srun steps of 48 nodes x 8 (trainer/in_allocation.py, which
    # tests/trainer/test_in_allocation_launcher.py checks), after a health check of all 52.
    launcher = text[text.index("\nexec python3 -m trainer.in_allocation ") :]
    assert "--nodes 48 --tasks-per-node 8 --cpus-per-task 8" in launcher and "--srun-wait 60" in launcher
    assert "--health --health-seconds 180" in launcher
    assert launcher.rstrip().endswith(f"-- python3 -m trainer {GOLDEN_RUN_DIR}")


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_renders_and_passes_bash_n(config: Path, tmp_path: Path):
    text = render_sbatch(load_config(config), str(tmp_path / "run"))
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    # sbatch stops reading #SBATCH at the first command: every directive must come before it.
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    late = [line for line in lines[first_command:] if line.startswith("#SBATCH")]
    assert not late, f"#SBATCH lines after the first command are ignored by sbatch: {late}"
    if load_config(config).cluster.spare_nodes:  # the launcher's exit code is the job's (exec)
        assert lines[-1].endswith(" -m trainer " + str(tmp_path / "run")) and "\nexec " in text
    else:
        srun = text[text.index("\nsrun ") :]
        assert " -m trainer " in srun and lines[-1] == 'exit "$rc"', "the job must end with the ranks' exit code"
