"""`runctl report RUN_DIR`: the loss curve with the restarts marked, and the goodput.

Goodput = useful training / wall time, and where the rest went: orchestrator.views.goodput charges
every second from the first submission to the end (the stop, else now) to one category (queue,
init, saves, loads, recomputed steps, detection wait, no job...), for the whole run and the last
24 h. Each incident (failure -> detection -> restart -> first step) is listed with its latencies
and the work it lost.

Writes <run_dir>/reports/loss.png, reports/goodput.png (stacked bars: whole run and last 24 h)
and reports/summary.json. matplotlib is imported only here (it is in the `dev` extra; without it
the summary is still written and the PNGs are skipped).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from orchestrator.contract import RunPaths, StepMetrics, atomic_write_json, read_metrics
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.events import read_events
from orchestrator.views.goodput import CATEGORIES, LABELS, run_breakdown


def segments(metrics: list[StepMetrics]) -> list[list[StepMetrics]]:
    """Split metrics lines into runs of increasing steps: a restart starts a new segment."""
    out: list[list[StepMetrics]] = []
    previous = None
    for record in metrics:
        if previous is None or record.step <= previous:
            out.append([])
        out[-1].append(record)
        previous = record.step
    return out


def summarize(paths: RunPaths, now: float | None = None) -> dict[str, Any]:
    metrics = read_metrics(paths.metrics)
    events = read_events(paths.events)
    final: dict[int, StepMetrics] = {}
    for record in metrics:
        final[record.step] = record  # the last write of a step is the one that survived
    spent = sum(m.step_seconds or 0.0 for m in metrics)
    useful = sum(m.step_seconds or 0.0 for m in final.values())
    time_breakdown = run_breakdown(paths.root, now=now, checkpoints_dir=_checkpoints_dir(paths))
    whole = time_breakdown["whole_run"]
    incidents = []
    firsts = [e for e in events if isinstance(e, fev.FirstStepAfterRestart)]
    for restart in (e for e in events if isinstance(e, fev.Restart)):
        # The first step after *this* restart: a job with spares restarts inside itself, under one id.
        first = next(
            (f for f in firsts if f.job_id == restart.job_id and (f.time or 0) >= (restart.time or 0)), None
        )
        incidents.append({
            "cause": restart.cause,
            "in_allocation": bool(restart.in_allocation),
            "how": restart.how,
            "failed_job": restart.failed_job_id,
            "new_job": restart.job_id,
            "detection_latency_s": _diff(restart.detection_time, restart.failure_time),
            "failure_to_first_step_s": first.seconds_since_failure if first else None,
            "resume_step": restart.resume_step,
            "work_lost_steps": restart.work_lost_steps,
            "work_lost_s": restart.work_lost_seconds,
            "excluded": restart.excluded,
        })  # fmt: skip
    stop = next((e for e in reversed(events) if isinstance(e, fev.RunStopped)), None)
    return {
        "run_dir": str(paths.root),
        "steps": max(final) if final else 0,
        "final_loss": final[max(final)].loss if final else None,
        "wall_seconds": whole["wall_seconds"],
        "useful_compute_seconds": useful,
        "spent_compute_seconds": spent,
        "goodput": whole["goodput"],
        "goodput_last_24h": time_breakdown["last_24h"]["goodput"],
        "time_breakdown": {k: v for k, v in time_breakdown.items() if k != "segments"},
        "restarts": len(incidents),
        "incidents": incidents,
        "corrupt_checkpoints": [e.to_dict() for e in events if isinstance(e, ev.CheckpointCorrupt)],
        "status": stop.status if stop else None,
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
    metrics = read_metrics(paths.metrics)
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for index, segment in enumerate(segments(metrics)):
        steps = [m.step for m in segment if m.loss is not None]
        losses = [m.loss for m in segment if m.loss is not None]
        ax.plot(steps, losses, lw=1.4, label=f"job segment {index + 1}" if index < 6 else None)
    for restart in read_events(paths.events, kinds=(fev.Restart,)):
        x = restart.last_step if restart.last_step is not None else restart.resume_step
        ax.axvline(x, color="red", ls="--", lw=1)
        ax.annotate(
            f"{restart.cause}\nresume @ {restart.resume_step}",
            (x, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            color="red",
            fontsize=8,
            va="top",
        )
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


# Every goodput category, in bar order, with its colour (green is the only good one).
BAR_COLORS = {
    "useful_training": "#2ca02c",
    "recomputed_steps": "#9467bd",
    "detection_wait": "#d62728",
    "checkpoint_save": "#1f77b4",
    "checkpoint_load": "#17becf",
    "init_rendezvous": "#bcbd22",
    "eval": "#8c564b",
    "queue_wait": "#ff7f0e",
    "no_job": "#7f7f7f",
}


def plot_goodput(paths: RunPaths, breakdown: dict[str, Any], out: Path) -> Path | None:
    """Two stacked horizontal bars (whole run, last 24 h): the share of wall time per category."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    rows = [("whole run", breakdown["whole_run"]), ("last 24 h", breakdown["last_24h"])]
    fig, ax = plt.subplots(figsize=(10, 3.2), dpi=110)
    lefts = [0.0 for _ in rows]
    order = [*BAR_COLORS, *(c for c in CATEGORIES if c not in BAR_COLORS)]
    for name in order:  # useful training first, in green; the losses after it
        color = BAR_COLORS.get(name, "#c7c7c7")
        widths = [part["fraction"].get(name) or 0.0 for _, part in rows]
        ax.barh([r for r, _ in rows], widths, left=lefts, color=color, label=LABELS[name])
        lefts = [a + b for a, b in zip(lefts, widths, strict=True)]
    for y, (_, part) in enumerate(rows):
        if part["goodput"] is not None:
            ax.text(1.01, y, f"goodput {part['goodput']:.1%}", va="center", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of wall time")
    ax.set_title(f"{_run_name(paths)}: where the wall time went")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize=7, frameon=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


def _checkpoints_dir(paths: RunPaths) -> Path | None:
    try:
        from orchestrator.plan.config import load_config  # noqa: PLC0415

        return RunPaths.of(paths.root, load_config(paths.config).checkpoint.dir).checkpoints
    except Exception:  # a report shows what it can: the default place then
        return None


def _run_name(paths: RunPaths) -> str:
    try:
        for line in paths.config.read_text().splitlines():
            if line.startswith("name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return paths.root.name


def write_report(
    run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, now: float | None = None
) -> dict[str, Any]:
    paths = RunPaths.of(run_dir)
    out = Path(out_dir) if out_dir else paths.reports
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(paths, now=now)
    png = plot_loss(paths, out / "loss.png")
    summary["loss_png"] = str(png) if png else None
    goodput_png = plot_goodput(paths, summary["time_breakdown"], out / "goodput.png")
    summary["goodput_png"] = str(goodput_png) if goodput_png else None
    if png is None:
        summary["loss_png_skipped"] = "matplotlib is not installed (pip install matplotlib, or the dev extra)"
    atomic_write_json(out / "summary.json", summary)
    summary["summary_json"] = str(out / "summary.json")
    return summary
