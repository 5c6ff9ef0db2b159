"""The rendered job scripts: the recorded BLOOM script, and every shipped config renders and
passes `bash -n`.

Re-record the golden file after an intended template change (or a change of the job name,
render.run_job_name), then review the diff:
    RECORD_GOLDEN=1 python -m pytest tests/slurm/test_sbatch_golden.py
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from orchestrator.plan.config import load_config, parse_config
from orchestrator.slurm.render import render_sbatch, srun_preview, trainer_argv

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
    # the singleton key is the run: the config's name and a short hash of the run directory
    assert re.fullmatch(r"tr11-176B-ml-[0-9a-f]{6}", sbatch["job-name"])
    assert sbatch["output"] == f"{GOLDEN_RUN_DIR}/jobs/slurm-%j.out"
    assert "export CUDA_LAUNCH_BLOCKING=1" in text
    # The launcher runs the trainer as srun steps of 48 nodes x 8 (orchestrator/slurm/launcher, which
    # tests/trainer/test_in_allocation_launcher.py checks), after a health check of all 52, and
    # waits for the controller's decision after a failed launch (a job with spares).
    launcher = text[text.index("\nexec python3 -m orchestrator.slurm.launcher ") :]
    assert "--nodes 48 --tasks-per-node 8 --cpus-per-task 8" in launcher and "--srun-wait 60" in launcher
    assert "--health --health-seconds 180" in launcher and "--decision-seconds 120" in launcher
    assert launcher.rstrip().endswith(f"-- python3 -m trainer {GOLDEN_RUN_DIR}")
    # What the launcher will run is written out for the admin who reads the script.
    assert "#   srun --kill-on-bad-exit=1 --wait=60 --job-name=launch-0 --nodes=48 --ntasks=384 " in text


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
    # Every job, with spares or without, execs the one launcher: its exit code is the job's, and
    # the srun lines it will run are the ones `runctl submit --dry-run` prints.
    cfg = load_config(config)
    assert lines[-1].startswith("exec ") and " -m orchestrator.slurm.launcher " in lines[-1]
    assert lines[-1].endswith(" -m trainer " + str(tmp_path / "run"))
    preview = srun_preview(cfg, str(tmp_path / "run"), trainer_argv(cfg, str(tmp_path / "run")))
    assert preview and all(f"#   {line}" in lines for line in preview)
    assert ("--decision-seconds 0 " in lines[-1]) == (cfg.cluster.spare_nodes == 0)


def test_site_setup_lines_are_quoted_words_before_the_launcher(tmp_path: Path):
    data = load_config(REPO / "configs" / "tiny-cpu.yaml").model_dump()
    data["cluster"]["setup"] = [["module", "load", "cuda/12.4"], ["source", "/opt/venv/bin/activate"],
                                ["echo", "$(touch /tmp/pwned); rm -rf ~"]]
    text = render_sbatch(parse_config(data, source="test"), str(tmp_path / "run"))
    body = text[text.index("cluster.setup") :]
    assert "\nmodule load cuda/12.4\nsource /opt/venv/bin/activate\n" in body
    assert "\necho '$(touch /tmp/pwned); rm -rf ~'\n" in body, "a config word never becomes shell"
    assert body.index("module load") < body.index("\nexec ")
    bad = {**data, "cluster": {**data["cluster"], "setup": [["echo", "two\nlines"]]}}
    with pytest.raises(ValueError, match="setup"):
        parse_config(bad, source="test")
