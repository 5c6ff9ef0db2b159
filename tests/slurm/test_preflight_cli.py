"""Configs that cannot run, refused by the real CLI (`runctl plan` and `runctl submit`, dry run
included) with the exit code and the fix: the time budget (orchestrator/plan/time_budget.py), the
plan's override flags, and the submit host's pre-flight (orchestrator/plan/preflight.py). A refused
submission leaves nothing on disk.

The expected numbers are worked out by hand from the configs (e.g. BLOOM's init timeout 3600 s +
save 300 s + pre-timeout margin 600 s = 4500 s = 01:15:00), not by the code under test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.errors import EXIT_DOES_NOT_FIT, EXIT_OK, EXIT_USAGE

REPO = Path(__file__).resolve().parents[2]
BLOOM = REPO / "configs" / "bloom-176b.yaml"
DEMO = REPO / "configs" / "demo-cpu-4node.yaml"
CORPUS = REPO / "data" / "corpus" / "multilingual_text_document"


def write_config(tmp_path: Path, base: Path, changes: dict) -> Path:
    data = yaml.safe_load(base.read_text())
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition(".")
        target = data
        for part in section.split(".") if section else []:
            target = target.setdefault(part, {})
        if value is None and key in target:
            del target[key]
        else:
            target[key] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of one command (nothing printed here: it would be captured
    into the next command's output)."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


# (config changes, the fixes and facts the refusal must name)
TIME_BUDGET = {
    "a 4-minute time limit": (
        {"cluster.time_limit": "00:04:00"},
        ["init + one save + the pre-timeout margin", "4500 s", "Set time_limit to at least 01:15:00"],
    ),
    "a limit shorter than the checkpoint interval": (
        {"cluster.time_limit": "02:00:00", "checkpoint.exit_duration_minutes": 110},
        ["checkpoint.interval_hours = 3 = 3.00 h, is longer than cluster.time_limit = 02:00:00"],
    ),
    "an exit duration past the limit": (
        {"checkpoint.exit_duration_minutes": 7000},
        ["checkpoint.exit_duration_minutes = 7000", "Set exit_duration_minutes to at most 5995"],
    ),
    "a save longer than its timeout, the interval and the margin": (
        {"checkpoint.save_seconds": 30000},
        ["Set checkpoint_timeout_seconds to at least 60000", "the trainer would save after every step",
         "Set pre_timeout_seconds to at least 30000"],
    ),  # fmt: skip
    "an evaluation longer than its timeout": (
        {"data.eval_iters": 100},
        ["data.eval_iters = 100", "watchdog.eval_timeout_seconds = 1800", "or lower eval_iters"],
    ),
}


@pytest.mark.parametrize("case", TIME_BUDGET, ids=list(TIME_BUDGET))
def test_plan_and_submit_refuse_what_does_not_fit_the_time_budget(case, tmp_path, capsys, mock_slurm_dir):
    changes, fixes = TIME_BUDGET[case]
    config = write_config(tmp_path, BLOOM, changes)
    for argv in (["plan", str(config)],
                 ["submit", str(config), "--run-dir", str(tmp_path / "run"), "--dry-run", "--skip-host-checks"],
                 ["submit", str(config), "--run-dir", str(tmp_path / "run"), "--skip-host-checks"]):  # fmt: skip
        code, text = run_cli(capsys, *argv)
        flat = " ".join(text.split())  # plan's rich output wraps lines
        assert code == EXIT_DOES_NOT_FIT, f"{argv[0]}: {case} must not fit"
        for fix in fixes:
            assert fix in flat, f"{argv[0]} must say: {fix}"
    assert not (tmp_path / "run").exists()


OVERRIDES = {
    "--tflops -5": ["--tflops", "-5"],
    "--tflops 0": ["--tflops", "0"],
    "--tflops nan": ["--tflops", "nan"],
    "--gpu-mtbf-hours 0": ["--gpu-mtbf-hours", "0"],
    "--save-seconds -1": ["--save-seconds", "-1"],
    "--train-tokens inf": ["--train-tokens", "inf"],
    "--snapshot-gb-per-second 0": ["--snapshot-gb-per-second", "0"],
}


@pytest.mark.parametrize("flag", OVERRIDES, ids=list(OVERRIDES))
def test_plan_overrides_are_checked_like_config_values(flag, capsys):
    code, text = run_cli(capsys, "plan", str(BLOOM), *OVERRIDES[flag])
    assert code == EXIT_USAGE and f"runctl plan: {OVERRIDES[flag][0]} " in text and "give " in text
    assert "math domain error" not in text and "fits" not in text


def test_plan_overrides_are_used_and_named(capsys):
    code, text = run_cli(capsys, "plan", str(BLOOM), "--save-seconds", "30000")
    assert code == EXIT_DOES_NOT_FIT and "one save (--save-seconds = 30000 s)" in " ".join(text.split())
    # 10 TFLOPs per GPU: 6.02e18 hardware FLOPs an iteration / (384 GPUs x 1e13) = 1568 s a step
    code, text = run_cli(capsys, "plan", str(BLOOM), "--tflops", "10")
    flat = " ".join(text.split())
    assert code == EXIT_DOES_NOT_FIT and "takes 1568 s at --tflops 10" in flat
    assert "watchdog.step_timeout_seconds = 900" in flat


def demo(tmp_path: Path, **changes) -> Path:
    """The demo config, written elsewhere: its relative paths made absolute (they are relative to
    the config file), then `changes`."""
    fixed = {"cluster.python": sys.executable, "data.datasets": [{"path": str(CORPUS)}],
             "data.tokenizer": str(REPO / "data" / "tokenizer.json")}  # fmt: skip
    return write_config(tmp_path, DEMO, {**fixed, **changes})


PREFLIGHT = {
    "a misspelt dataset": (
        {"data.datasets": [{"path": str(CORPUS) + "_typo"}]},
        ["data.datasets[0].path", "multilingual_text_document_typo.idx not found",
         f"datasets in {CORPUS.parent}: multilingual_text_document"],
    ),  # fmt: skip
    "a missing tokenizer": ({"data.tokenizer": "/nonexistent/tokenizer.json"}, ["data.tokenizer = /nonexistent"]),
    "a missing python": ({"cluster.python": "/nonexistent/venv/bin/python"}, ["cluster.python = /nonexistent"]),
    "an operators group that does not exist": (
        {"operators.group": "no-such-group-23"},
        ["operators.group = no-such-group-23: no such group", "Give an existing group"],
    ),
}


@pytest.mark.parametrize("case", PREFLIGHT, ids=list(PREFLIGHT))
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "submit"])
def test_submit_refuses_what_this_host_says_cannot_run(case, dry, tmp_path, capsys, mock_slurm_dir):
    changes, facts = PREFLIGHT[case]
    config = demo(tmp_path, **changes)
    code, text = run_cli(capsys, "submit", str(config), "--run-dir", str(tmp_path / "run"), *(["--dry-run"] if dry else []))
    assert code == EXIT_USAGE
    errors = [line for line in text.splitlines() if line.startswith("  - ")]
    assert len(errors) == 1, f"exactly the one problem of the case: {errors}"
    for fact in facts:
        assert fact in errors[0]
    assert "Nothing was written or submitted" in text and not (tmp_path / "run").exists()


def test_submit_refuses_a_disk_that_cannot_hold_the_checkpoints(tmp_path, capsys, mock_slurm_dir):
    """BLOOM's checkpoints are 2.3 TiB each (the planner: 176e9 parameters x 14 bytes); keep_last
    5 + 1 of them fit no disk of a CI machine."""
    config = write_config(tmp_path, BLOOM, {
        "data.datasets": [{"path": str(CORPUS)}], "data.tokenizer": str(REPO / "data" / "tokenizer.json"),
        "cluster.python": sys.executable, "operators.group": None,
    })  # fmt: skip
    code, text = run_cli(capsys, "submit", str(config), "--run-dir", str(tmp_path / "run"), "--dry-run")
    errors = [line for line in text.splitlines() if line.startswith("  - ")]
    assert code == EXIT_USAGE and len(errors) == 1 and errors[0].startswith("  - disk: ")
    assert "keep_last + 1 = 6 checkpoints of 2298.0 GiB" in errors[0]
    assert "checkpoint.dir" in errors[0], "the fix: a bigger filesystem (or a lower keep_last)"
    assert "(warning) operators.group is not set" in text


def test_warnings_do_not_stop_a_submission(tmp_path, capsys, mock_slurm_dir):
    config = demo(tmp_path, **{"operators.group": None})
    code, text = run_cli(capsys, "submit", str(config), "--run-dir", str(tmp_path / "run"))
    assert code == EXIT_OK and "warning: operators.group is not set: only you (the owner) can kill" in text
    assert (tmp_path / "run" / "run.yaml").exists()
