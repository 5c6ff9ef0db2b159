"""A site's environment on the real local SLURM cluster, through the CLI only (submit, watch,
status, events), as an operator drives it:
- the shipped configs/tiny-cpu.yaml, unchanged, trains to its end: its `python:` is the checkout's
  venv as written (a venv's bin/python resolved to the base interpreter had no torch);
- a rank that runs out of memory (MemoryError): its exception's line (not srun's `Exited with exit
  code 21`) is in the failure event, in `status` and in `events`; the cause is out_of_memory and
  the restart excludes no node; the job was submitted with a site's mail options (`mail-type:
  END,FAIL`, `mail-user`), which slurmctld took as given.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from fakes import REPO
from one_rank_run import one_rank_config, submit_environment, write_config

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.ledger import read_submissions
from orchestrator.slurm.render import run_job_name

pytestmark = pytest.mark.slurm
STOPPED = ("finished", "crash_loop", "killed", "config_error", "failed")


@pytest.fixture
def cluster_env(local_cluster, monkeypatch):
    submit_environment(local_cluster, monkeypatch)
    return local_cluster


def watch_until(run_dir: Path, capsys, seconds: float, done) -> str:
    deadline = time.monotonic() + seconds
    status = None
    while time.monotonic() < deadline:
        assert main(["watch", str(run_dir), "--once", "--json"]) == 0
        status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"]
        if done(status):
            return status
        time.sleep(1)
    return status


def test_the_shipped_tiny_cpu_config_trains_to_its_end_with_the_venv_it_names(cluster_env, tmp_path, capsys):
    config = REPO / "configs" / "tiny-cpu.yaml"
    assert "python: ../.venv/bin/python" in config.read_text(), "the shipped config as users get it"
    venv_python = REPO / ".venv" / "bin" / "python"
    if not venv_python.is_symlink():
        pytest.fail(f"{venv_python} is not the venv's symlink: run `make install` first")
    run_dir = tmp_path / "tiny"
    assert main(["submit", str(config), "--run-dir", str(run_dir)]) == 0, capsys.readouterr().err
    frozen = yaml.safe_load((run_dir / "run.yaml").read_text())
    assert frozen["cluster"]["python"] == str(venv_python), "kept as the venv's own path"
    status = watch_until(run_dir, capsys, 420, lambda s: s in STOPPED)
    paths = RunPaths.of(run_dir)
    output = "".join(p.read_text(errors="replace")[-3000:] for p in paths.jobs.glob("slurm-*.out"))
    assert status == "finished", output
    state = json.loads(paths.state.read_text())
    assert state["restarts"] == 0 and len(state["jobs"]) == 1 and state["jobs"][0]["exit_code"] == 0
    last = read_jsonl(paths.metrics)[-1]
    print(f"tiny-cpu: {len(read_jsonl(paths.metrics))} steps, last {last}")
    assert last["step"] == 200, "1600 samples at a global batch of 8"


def test_a_rank_out_of_memory_shows_its_error_blames_no_node_and_mail_options_reach_slurm(cluster_env, tmp_path, capsys):
    config, _ = one_rank_config(tmp_path)
    config["cluster"]["extra_sbatch"] = {"mail-type": "END,FAIL", "mail-user": "oncall@example.org"}
    path = write_config(tmp_path, config, "raises.yaml")
    run_dir = tmp_path / "run"
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TRAINER_FAULT", "oom@step2")  # a test's environment, never a config's
            assert main(["submit", path, "--run-dir", str(run_dir)]) == 0, capsys.readouterr().err
            paths = RunPaths.of(run_dir)
            first_job = read_submissions(paths.submissions)[0].job_id
            shown = subprocess.run(["scontrol", "show", "job", first_job], capture_output=True, text=True,
                                   env=cluster_env.slurm_env()).stdout  # fmt: skip
            assert "MailUser=oncall@example.org" in shown and "MailType=END,FAIL" in shown, shown

            def restarted(_status: str) -> bool:
                return any(e.get("event") == "restart" for e in read_jsonl(paths.events))

            watch_until(run_dir, capsys, 240, restarted)
    finally:
        name = run_job_name("demo-cpu-4node", str(run_dir))
        subprocess.run(["scancel", "--name", name], env=cluster_env.slurm_env(), check=False)
    failures = [e for e in read_jsonl(paths.events) if e.get("event") == "failure"]
    output = "".join(p.read_text(errors="replace")[-3000:] for p in paths.jobs.glob("slurm-*.out"))
    assert failures, output
    said = "rank 0: MemoryError: TEST FAULT oom at step 2 on rank 0"
    print(failures[0])
    assert failures[0]["cause"] == "out_of_memory" and failures[0]["exit_code"] == 21, failures[0]
    assert failures[0]["rank_error"] == said
    # Out of memory is the job's, not the node's: restarted with no node excluded.
    assert not paths.exclude_list.exists() or not json.loads(paths.exclude_list.read_text()).get("nodes")
    assert failures[0]["rank_error_lines"][0] == "Traceback (most recent call last):"
    assert main(["status", str(run_dir)]) == 0
    status_screen = capsys.readouterr().out
    print(status_screen)
    assert "MemoryError: TEST FAULT oom at step 2" in status_screen and "a rank out of memory" in status_screen
    assert main(["events", str(run_dir), "--type", "failure"]) == 0
    assert said in capsys.readouterr().out
