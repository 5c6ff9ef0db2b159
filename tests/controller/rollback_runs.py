"""What the real-cluster rollback tests share: drive a controller until the run stops, and read
back what a run did (events of a kind, the jobs' output, the sample order the kept history read)."""

from __future__ import annotations

import time

from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from tests.run_records import event_dicts


def drive(ctl: Controller, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = ctl.tick().status
        if status in RunStatus.STOPPED:
            return status
        time.sleep(ctl.cfg.watchdog.poll_seconds)
    outputs = "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(ctl.paths.jobs.glob("slurm-*.out")))
    raise AssertionError(f"not stopped in {seconds} s: {ctl.state.status}\n{outputs}")


def job_outputs(paths: RunPaths) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(paths.jobs.glob("slurm-*.out")))


def of_kind(paths: RunPaths, kind: str) -> list[dict]:
    return [e for e in event_dicts(paths) if e["event"] == kind]


def sample_lines(paths: RunPaths) -> list[dict]:
    return read_jsonl(paths.sample_log(0))


def final_order(paths: RunPaths) -> list[int]:
    """The positions the kept history read, in order: the last line of each step (the sample log
    is appended to; a step trained again after a rollback comes later)."""
    last = {line["step"]: line["positions"] for line in sample_lines(paths)}
    return [p for step in sorted(last) for p in last[step]]
