"""What `runctl health` shows: the training-health findings on the end of metrics.jsonl, what the
controller did about them (its health events), and the loss curve around them as a PNG.

Read-only, for any operator: nothing in the run directory is written. The findings are computed
here with the run's own rules and thresholds (orchestrator/contract/training_health.py, `health:` of
run.yaml) over the last `history_length` steps of the current lineage, so they are there whether
or not a controller runs; the events say which the controller saw, and what it did (paused, rolled
back, refused). The curve also shows the steps a rollback abandoned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import RunPaths, StepMetrics, tail_metrics
from orchestrator.contract import events as ev
from orchestrator.contract import health_events as hev
from orchestrator.contract.state import load_state
from orchestrator.contract.textsafe import for_terminal
from orchestrator.contract.training_health import TrainingFinding, assess, history_length, lineage, policy_for

HEALTH_EVENTS = (
    hev.HealthFinding,
    hev.HealthPauseRequested,
    hev.RollbackPlanned,
    hev.RollbackRefused,
    hev.RollbackStarted,
    hev.RollbackApplied,
)
MIN_TAIL_BYTES = 1 << 20
TAIL_BYTES_PER_STEP = 512  # a metrics line is ~300 bytes
LAST_EVENTS = 30


@dataclass
class HealthView:
    status: str
    records: list[StepMetrics]  # every step in the tail read, abandoned histories included
    history: list[StepMetrics]  # the current lineage
    findings: list[TrainingFinding]
    policies: list[str]
    events: list[ev.Event] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {
            "status": self.status,
            "steps_read": len(self.records),
            "last_step": last.step if last else None,
            "last_loss": last.loss if last else None,
            "findings": [
                {**f.as_dict(), "policy": p} for f, p in zip(self.findings, self.policies, strict=True)
            ],
            "controller_events": [e.to_dict() for e in self.events],
        }


def read_health(run_dir: str | Path, cfg) -> HealthView:
    paths = RunPaths.of(run_dir)
    keep = history_length(cfg.health)
    records = tail_metrics(paths.metrics, max(MIN_TAIL_BYTES, TAIL_BYTES_PER_STEP * keep))
    history = lineage(records)[-keep:]
    findings = assess(history, cfg.health)
    events = ev.read_events(paths.events, kinds=HEALTH_EVENTS)[-LAST_EVENTS:]
    return HealthView(
        status=load_state(paths).status.value,
        records=records,
        history=history,
        findings=findings,
        policies=[policy_for(f, cfg.health) for f in findings],
        events=events,
    )


def describe(view: HealthView) -> list[str]:
    """Lines for a person (every value from the run directory made printable)."""
    last = view.history[-1] if view.history else None
    lines = [
        f"status: {view.status}; last step {last.step if last else '-'}"
        + (f", loss {last.loss:.4g}" if last and last.loss is not None else "")
        + f" ({len(view.history)} steps of the current history judged)"
    ]
    if not view.findings:
        lines.append("findings: none on the steps read")
    for finding, policy in zip(view.findings, view.policies, strict=True):
        lines.append(f"finding ({policy}): {for_terminal(finding.message)}")
    if view.events:
        lines.append("what the controller did:")
    for event in view.events:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.time or 0))
        shown = {
            k: v
            for k, v in event.details().items()
            if k not in ("numbers", "message") and v not in (None, [])
        }
        details = ", ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in shown.items())
        lines.append(f"  {stamp}  {event.KIND}: {for_terminal(details)[:300]}")
    return lines
