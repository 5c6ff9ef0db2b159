"""`runctl submit/status/cancel` end to end against the mocked SLURM (scenario mode)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.cli.main import main
from orchestrator.errors import EXIT_DOES_NOT_FIT, EXIT_USAGE
from orchestrator.operate.runs import job_table, submit_job
from orchestrator.plan.config import load_config
from orchestrator.slurm.mock import MockScheduler

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo-cpu-4node.yaml"
BLOOM = REPO / "configs" / "bloom-176b.yaml"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dry_run_writes_nothing_and_shows_the_script_and_the_chain(mock_slurm_dir, tmp_path, capsys):
    run_dir = tmp_path / "bloom"
    argv = ["submit", str(BLOOM), "--run-dir", str(run_dir), "--dry-run", "--skip-host-checks", "--chain", "5"]
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["dry_run"] and result["job_ids"] == [] and result["chain"] == 5
    assert "#SBATCH --nodes=52" in result["script_text"]  # 48 + BLOOM's 4 spares
    assert f"#SBATCH --job-name={result['job_name']}\n" in result["script_text"]
    assert not run_dir.exists(), "a dry run must leave nothing on disk"
    assert MockScheduler(mock_slurm_dir).slurm.commands() == [], "a dry run must not call sbatch"
    code, out, _ = run_cli(capsys, *argv)
    print(out[:1200])
    assert code == 0 and "would submit 5 jobs" in out and "job 5 starts when job 4 ends" in out
    assert "#SBATCH --dependency=singleton" in out and not run_dir.exists()
    # the config fixed after a first look: a second dry run into the same run directory works
    data = yaml.safe_load(BLOOM.read_text())
    data["cluster"]["time_limit"] = "20:00:00"
    data["checkpoint"]["exit_duration_minutes"] = 1190
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(capsys, "submit", str(fixed), "--run-dir", str(run_dir), "--dry-run", "--skip-host-checks")
    assert code == 0, err
    assert "#SBATCH --time=20:00:00" in out and not run_dir.exists()


def test_chain_status_and_cancel(mock_slurm_dir, tmp_path, capsys):
    run_dir = tmp_path / "demo"
    code, out, _ = run_cli(capsys, "submit", str(DEMO), "--run-dir", str(run_dir), "--chain", "3", "--json")
    assert code == 0
    ids = json.loads(out)["job_ids"]
    assert len(ids) == 3
    sbatch_calls = [c for c in MockScheduler(mock_slurm_dir).slurm.commands() if c[0] == "sbatch"]
    assert all("--dependency=singleton" in c for c in sbatch_calls) and len(sbatch_calls) == 3
    for job_id in ids:
        assert (run_dir / "jobs" / job_id / "job.sbatch").exists()
    code, out, _ = run_cli(capsys, "status", str(run_dir), "--json")
    rows = json.loads(out)["jobs"]
    assert [r["job_id"] for r in rows] == ids and [r["state"] for r in rows] == ["pending"] * 3
    assert [r["submit_reason"] for r in rows] == ["submit", "chain", "chain"]
    code, out, _ = run_cli(capsys, "status", str(run_dir))  # the first job starts running
    assert "running" in out and "waits for the job before it (singleton)" in " ".join(out.split())
    code, out, _ = run_cli(capsys, "cancel", str(run_dir), "--json")
    assert code == 0 and sorted(json.loads(out)["cancelled"]) == sorted(ids)
    rows = job_table(run_dir, MockScheduler(mock_slurm_dir))
    assert [r.state for r in rows] == ["cancelled"] * 3
    code, out, _ = run_cli(capsys, "cancel", str(run_dir))
    assert "nothing to cancel" in out


def test_status_remembers_jobs_the_scheduler_forgot(mock_slurm_dir, tmp_path):
    cfg = load_config(DEMO)
    sched = MockScheduler(mock_slurm_dir)
    from orchestrator.operate.runs import prepare_run_dir

    prepare_run_dir(cfg, tmp_path / "r")
    sched.slurm.push_scenario([{"state": "RUNNING", "polls": 1}, {"state": "COMPLETED", "exit_code": 18}])
    job = submit_job(tmp_path / "r", cfg, sched, reason="restart", exclude=["node03"])
    job_table(tmp_path / "r", sched)
    rows = job_table(tmp_path / "r", sched)
    assert (rows[0].state, rows[0].exit_code, rows[0].outcome) == ("completed", 18, "time_budget")
    assert "#SBATCH --exclude=node03" in (tmp_path / "r" / "jobs" / job / "job.sbatch").read_text()
    # a new, empty mock: SLURM has forgotten the job; the last seen state stays, marked stale
    rows = job_table(tmp_path / "r", MockScheduler(tmp_path / "empty-mock"))
    assert (rows[0].state, rows[0].stale) == ("completed", True)


def test_submit_refuses_a_config_the_planner_rejects(mock_slurm_dir, tmp_path, capsys):
    data = yaml.safe_load(BLOOM.read_text())
    data["cluster"]["gpu_memory_gib"] = 8
    small = tmp_path / "small-gpus.yaml"
    small.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "submit", str(small), "--run-dir", str(tmp_path / "x"), "--dry-run")
    assert code == EXIT_DOES_NOT_FIT and "does not fit" in err
    assert not (tmp_path / "x").exists()


def test_submit_refuses_bad_configs_and_foreign_run_dirs(mock_slurm_dir, tmp_path, capsys):
    data = yaml.safe_load(DEMO.read_text())
    data["cluster"]["partition"] = "debug;rm -rf /"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, _, err = run_cli(capsys, "submit", str(bad), "--dry-run", "--run-dir", str(tmp_path / "b"))
    assert code == EXIT_USAGE and "cluster.partition" in err
    assert run_cli(capsys, "submit", str(DEMO), "--run-dir", str(tmp_path / "r"))[0] == 0
    code, _, err = run_cli(capsys, "submit", str(BLOOM), "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert code == EXIT_USAGE and "already holds another config" in err
    code, _, err = run_cli(capsys, "status", str(tmp_path / "nowhere"))
    assert code == EXIT_USAGE and "not a run directory" in err


def test_submit_without_sbatch_and_without_asking_for_the_mock_is_an_error(tmp_path, capsys, monkeypatch):
    """`runctl submit` on a login node where SLURM's module is not loaded: refused, with what to
    load; nothing is recorded as submitted. A dry run still works there."""
    monkeypatch.delenv("RUNCTL_SCHEDULER", raising=False)
    monkeypatch.setenv("RUNCTL_MOCK_SLURM_DIR", str(tmp_path / "mock"))  # where a fallback would go
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    code, out, err = run_cli(capsys, "submit", str(DEMO), "--run-dir", str(tmp_path / "r"))
    assert code == EXIT_USAGE and "module load slurm" in err and "RUNCTL_SCHEDULER=mock" in err, (out, err)
    assert not (tmp_path / "r" / "jobs" / "submissions.jsonl").exists()
    code, out, _ = run_cli(capsys, "submit", str(DEMO), "--run-dir", str(tmp_path / "d"), "--dry-run", "--json")
    assert code == 0 and json.loads(out)["scheduler"] == "slurm"


def test_a_slurm_timeout_is_labelled_as_the_controller_labels_it(mock_slurm_dir, tmp_path):
    """A job SLURM ended TIMEOUT after the trainer saved on the pre-timeout signal (exit 18): the
    run continues, for `runctl status` as for the controller (classify_end): "time_budget"."""
    from orchestrator.contract import classify_end  # the one classification, the controller's too
    from orchestrator.operate.runs import prepare_run_dir

    cfg = load_config(DEMO)
    sched = MockScheduler(mock_slurm_dir)
    prepare_run_dir(cfg, tmp_path / "r")
    sched.slurm.push_scenario([{"state": "RUNNING", "polls": 1}, {"state": "TIMEOUT", "exit_code": 18}])
    submit_job(tmp_path / "r", cfg, sched)
    job_table(tmp_path / "r", sched)
    row = job_table(tmp_path / "r", sched)[0]
    assert (row.state, row.exit_code, row.outcome) == ("timeout", 18, "time_budget")
    assert row.outcome == classify_end(row.state, row.exit_code).value
