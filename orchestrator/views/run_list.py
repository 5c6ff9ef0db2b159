"""`runctl ls`: one line per run directory under a folder, from its files alone (no controller
needed): its name, the status the controller last wrote, its jobs and whether a controller
supervises it now. A run the reader may not open is listed as unreadable, never skipped."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract import RunPaths
from orchestrator.contract.controller_lock import lock_holder
from orchestrator.contract.state import load_state
from orchestrator.operate.runs import recorded_jobs, run_name


@dataclass(frozen=True)
class RunSummary:
    run_dir: str
    name: str = "?"
    status: str = (
        "?"  # a RunStatus value, or why there is none ("submitted, never supervised", "unreadable (...)")
    )
    jobs: int = 0
    live_jobs: int = 0  # jobs the controller has not settled (or never saw)
    controller: bool = False  # a controller holds the run's lock now
    state_age_seconds: float | None = None  # since the controller last wrote state.json


def describe_run(run_dir: Path, now: float) -> RunSummary:
    paths = RunPaths.of(run_dir)
    name = "?"
    try:
        name = run_name(paths)
        state = load_state(paths)
        controller = lock_holder(paths.root) is not None
    except PermissionError:
        return RunSummary(str(run_dir), name=name, status="unreadable (not an operator)")
    except (OSError, ValueError) as exc:
        return RunSummary(str(run_dir), name=name, status=f"unreadable ({type(exc).__name__})")
    status, age = "submitted, never supervised", None
    if paths.state.exists():
        status, age = state.status.value, max(0.0, now - paths.state.stat().st_mtime)
    # The jobs `runctl status` lists (the submissions ledger and state.json): a job the controller
    # has not settled, or has never seen (submitted, never supervised), is live.
    settled = {j.job_id for j in state.jobs if j.outcome is not None}
    jobs = recorded_jobs(paths.root)
    return RunSummary(
        str(run_dir), name=name, status=status, jobs=len(jobs),
        live_jobs=len([j for j in jobs if j.job_id not in settled]), controller=controller,
        state_age_seconds=age,
    )  # fmt: skip
