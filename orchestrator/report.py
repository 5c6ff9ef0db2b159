"""`runctl report RUN_DIR`: the loss curve with the restarts marked, and the goodput.

Goodput = useful compute / wall time, where useful compute is the step time of every step that
survived into the final trajectory (a step redone after a restart counts once) and wall time runs
from the first step's start to the last step's end. Each incident (failure -> detection ->
restart -> first step) is listed with its latencies and the work it lost.

Writes <run_dir>/reports/loss.png and reports/summary.json. matplotlib is imported only here
(it is in the `dev` extra; without it the summary is still written and the PNG is skipped).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.controller.state import read_events
from orchestrator.protocol import RunPaths, atomic_write_json, read_jsonl


def segments(metrics: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split metrics lines into runs of increasing steps: a restart starts a new segment."""
    out: list[list[dict[str, Any]]] = []
    previous = None
    for record in metrics:
        step = record.get("step")
        if step is None:
            continue
        if previous is None or step <= previous:
            out.append([])
        out[-1].append(record)
        previous = step
    return out


def summarize(paths: RunPaths) -> dict[str, Any]:
    metrics = read_jsonl(paths.metrics)
    events = read_events(paths)
    final: dict[int, dict[str, Any]] = {}
    for record in metrics:
        if record.get("step") is not None:
            final[record["step"]] = record  # the last write of a step is the one that survived
    spent = sum(float(m.get("step_seconds") or 0.0) for m in metrics)
    useful = sum(float(m.get("step_seconds") or 0.0) for m in final.values())
    times = [m["time"] for m in metrics if m.get("time")]
    wall = None
    if times:
        first = min(metrics, key=lambda m: m.get("time") or float("inf"))
        wall = max(times) - (first["time"] - float(first.get("step_seconds") or 0.0))
    incidents = []
    firsts = [e for e in events if e["event"] == "first_step_after_restart"]
    for restart in (e for e in events if e["event"] == "restart"):
        first = next((f for f in firsts if f["job_id"] == restart["job_id"]), None)
        incidents.append({
            "cause": restart.get("cause"),
            "failed_job": restart.get("failed_job_id"),
            "new_job": restart.get("job_id"),
            "detection_latency_s": _diff(restart.get("detection_time"), restart.get("failure_time")),
            "failure_to_first_step_s": first.get("seconds_since_failure") if first else None,
            "resume_step": restart.get("resume_step"),
            "work_lost_steps": restart.get("work_lost_steps"),
            "work_lost_s": restart.get("work_lost_seconds"),
            "excluded": restart.get("excluded"),
        })  # fmt: skip
    stop = next((e for e in reversed(events) if e["event"] == "run_stopped"), None)
    return {
        "run_dir": str(paths.root),
        "steps": max(final) if final else 0,
        "final_loss": final[max(final)].get("loss") if final else None,
        "wall_seconds": wall,
        "useful_compute_seconds": useful,
        "spent_compute_seconds": spent,
        "goodput": (useful / wall) if wall else None,
        "restarts": len(incidents),
        "incidents": incidents,
        "corrupt_checkpoints": [e for e in events if e["event"] == "checkpoint_corrupt"],
        "status": stop.get("status") if stop else None,
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return (a - b) if a is not None and b is not None else None


def plot_loss(paths: RunPaths, out: Path) -> Path | None:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    metrics = read_jsonl(paths.metrics)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for index, segment in enumerate(segments(metrics)):
        steps = [m["step"] for m in segment if m.get("loss") is not None]
        losses = [m["loss"] for m in segment if m.get("loss") is not None]
        ax.plot(steps, losses, lw=1.4, label=f"job segment {index + 1}" if index < 6 else None)
    for restart in (e for e in read_events(paths) if e["event"] == "restart"):
        x = restart.get("last_step") if restart.get("last_step") is not None else restart.get("resume_step", 0)
        ax.axvline(x, color="red", ls="--", lw=1)
        ax.annotate(f"{restart.get('cause')}\nresume @ {restart.get('resume_step')}", (x, 1), xycoords=("data", "axes fraction"),
                    xytext=(3, -12), textcoords="offset points", color="red", fontsize=8, va="top")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{_run_name(paths)}: loss (red: failures and restarts)")
    ax.grid(alpha=0.3)
    if metrics:
        ax.legend(loc="upper right", fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def _run_name(paths: RunPaths) -> str:
    try:
        for line in paths.config.read_text().splitlines():
            if line.startswith("name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return paths.root.name


def write_report(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    paths = RunPaths.of(run_dir)
    out = Path(out_dir) if out_dir else paths.reports
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(paths)
    png = plot_loss(paths, out / "loss.png")
    summary["loss_png"] = str(png) if png else None
    if png is None:
        summary["loss_png_skipped"] = "matplotlib is not installed (pip install matplotlib, or the dev extra)"
    atomic_write_json(out / "summary.json", summary)
    summary["summary_json"] = str(out / "summary.json")
    return summary
