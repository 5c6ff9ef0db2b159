"""The run at a glance, from the run directory alone (any operator can read it, no controller
needed): job chain and states, training progress, checkpoints, heartbeat age per node, excluded
nodes, recent events.

    data = dashboard_data(run_dir)        # plain dict (for --json)
    renderable = render_dashboard(run_dir)  # rich renderable for `runctl watch` / `runctl status`
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.controller.checkpoints import list_checkpoints
from orchestrator.controller.detection import read_heartbeats
from orchestrator.controller.exclude import read_excluded
from orchestrator.controller.lock import lock_holder
from orchestrator.controller.state import load_state, read_events
from orchestrator.controller_heartbeat import beat_file_age, read_beat
from orchestrator.protocol import JobState, RunPaths
from orchestrator.textsafe import for_rich, for_terminal

GRID_COLUMNS = 12  # 48 nodes -> 4 rows


def tail_jsonl(path: Path, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
    """The complete lines in the last `max_bytes` of a JSONL file (metrics grow for months)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            chunk = handle.read()
    except OSError:
        return []
    lines = chunk.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first line is probably cut
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _config(paths: RunPaths):
    try:
        from orchestrator.config import load_config  # noqa: PLC0415

        return load_config(paths.config)
    except Exception:  # a dashboard shows what it can
        return None


def dashboard_data(run_dir: str | os.PathLike[str], now: float | None = None) -> dict[str, Any]:
    paths = RunPaths.of(run_dir)
    now = now or time.time()
    cfg = _config(paths)
    state = load_state(paths)
    metrics = tail_jsonl(paths.metrics)
    last = metrics[-1] if metrics else {}
    total_steps = None
    if cfg is not None:
        total_steps = -(-cfg.train_samples // cfg.parallel.global_batch_size)
    step_seconds = [m.get("step_seconds") for m in metrics[-20:] if m.get("step_seconds")]
    eta = None
    if total_steps and last.get("step") is not None and step_seconds:
        eta = max(0, total_steps - last["step"]) * sum(step_seconds) / len(step_seconds)
    # Where the config puts them (checkpoint.dir), by the contract's one rule, as the trainer does.
    ckpt_dir = (RunPaths.of(paths.root, cfg.checkpoint.dir) if cfg is not None else paths).checkpoints
    complete = [c for c in list_checkpoints(ckpt_dir) if c.complete]
    last_ckpt = complete[-1] if complete else None
    next_due = {}
    if cfg is not None:
        if cfg.checkpoint.interval_steps:
            base = last_ckpt.step if last_ckpt else 0
            next_due["step"] = base + cfg.checkpoint.interval_steps
        if cfg.checkpoint.interval_hours and last_ckpt and last_ckpt.saved_at:
            next_due["in_seconds"] = last_ckpt.saved_at + cfg.checkpoint.interval_hours * 3600 - now
    live_job = next((j for j in reversed(state.jobs) if j.state == JobState.RUNNING), None)
    job_id = live_job.job_id if live_job else (state.jobs[-1].job_id if state.jobs else None)
    nodes: dict[str, dict[str, Any]] = {}
    # While a controller runs, the beat ages are its own (seconds since it saw each node's beat
    # change, on its monotonic clock); without one, node clocks against this machine's.
    seen_by_controller = _controller_beat_ages(paths, now) if lock_holder(paths.root) else {}
    for beat in read_heartbeats(paths.heartbeats):
        if job_id is not None and str(beat.get("job_id")) != str(job_id):
            continue
        host = beat.get("host", "?")
        if live_job and live_job.nodes and host not in live_job.nodes and cfg is not None:
            index = beat.get("rank", 0) // cfg.cluster.gpus_per_node
            host = live_job.nodes[index] if index < len(live_job.nodes) else host
        entry = nodes.setdefault(
            host, {"age": 0.0, "ranks": 0, "phase": beat.get("phase"), "step": beat.get("step")}
        )
        raw_host = str(beat.get("host", ""))
        age = seen_by_controller.get(raw_host, now - beat.get("beat_time", 0))
        entry["age"] = max(entry["age"], age)
        entry["stalled"] = max(
            entry.get("stalled", 0.0), now - max(beat.get("progress_time", 0), beat.get("phase_started", 0))
        )
        entry["ranks"] += 1
    return {
        "run": cfg.name if cfg else paths.root.name,
        "run_dir": str(paths.root),
        "status": state.status,
        "controller": lock_holder(paths.root),
        "last_pass_age": (now - state.last_pass) if state.last_pass else None,
        "restarts": state.restarts,
        "jobs": [vars(j) for j in state.jobs],
        "training": {
            "step": last.get("step"),
            "total_steps": total_steps,
            "loss": last.get("loss"),
            "tokens_per_s": last.get("tokens_per_s"),
            "tflops_per_gpu": last.get("tflops_per_gpu", last.get("tflops")),
            "eta_seconds": eta,
            "metrics_age": (now - last["time"]) if last.get("time") else None,
        },
        "checkpoint": {
            "dir": str(ckpt_dir),
            "last_step": last_ckpt.step if last_ckpt else None,
            "age_seconds": (now - last_ckpt.saved_at) if last_ckpt and last_ckpt.saved_at else None,
            "size_bytes": last_ckpt.size_bytes if last_ckpt else None,
            "next_due": next_due,
        },
        "heartbeat_job": job_id,
        "nodes": dict(sorted(nodes.items())),
        "dead_after": cfg.watchdog.dead_after_seconds if cfg else 60.0,
        "heartbeat_seconds": cfg.watchdog.heartbeat_seconds if cfg else 10.0,
        "excluded": read_excluded(paths),
        "events": read_events(paths, last=8),
        "goodput": _goodput(paths, now, ckpt_dir),
    }


def _controller_beat_ages(paths: RunPaths, now: float) -> dict[str, float]:
    beat = read_beat(paths) or {}
    ages = beat.get("node_beat_age")
    since = beat_file_age(paths, now)
    if not isinstance(ages, dict) or since is None:
        return {}
    return {str(h): float(a) + since for h, a in ages.items() if isinstance(a, (int, float))}


def _goodput(paths: RunPaths, now: float, ckpt_dir: Path) -> dict[str, Any] | None:
    """Whole-run and 24 h goodput with their largest losses (orchestrator.goodput)."""
    from orchestrator.goodput import run_breakdown  # noqa: PLC0415

    try:
        breakdown = run_breakdown(paths.root, now=now, checkpoints_dir=ckpt_dir)
    except (OSError, ValueError, TypeError, KeyError):  # a dashboard shows what it can
        return None
    return {window: {"goodput": breakdown[window]["goodput"], "fraction": breakdown[window]["fraction"]}
            for window in ("whole_run", "last_24h")}  # fmt: skip


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _clock(stamp: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(stamp)) if stamp else "-"


STATUS_STYLE = {
    "running": "green",
    "finished": "bold green",
    "killed": "yellow",
    "killing": "yellow",
    "crash_loop": "bold red",
    "restarting": "magenta",
    "waiting": "cyan",
    "config_error": "bold red",
}


def render_dashboard(run_dir: str | os.PathLike[str], data: dict[str, Any] | None = None):
    """A rich renderable of `dashboard_data` (imports rich only here)."""
    from rich.console import Group  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    d = data or dashboard_data(run_dir)
    parts = []
    ctl = d["controller"]
    head = Text()
    head.append(f"run {d['run']}  ", style="bold")
    head.append(d["status"].upper(), style=STATUS_STYLE.get(d["status"], "white"))
    head.append(f"   restarts {d['restarts']}   controller: ")
    head.append(
        f"pid {ctl.get('pid')} on {ctl.get('host')}" if ctl else "not running",
        style="green" if ctl else "red",
    )
    if d["last_pass_age"] is not None:
        head.append(f" (last pass {_ago(d['last_pass_age'])} ago)")
    parts.append(head)

    jobs = Table(title="jobs", title_justify="left", expand=False, pad_edge=False)
    for column in ("job", "why", "state", "outcome", "nodes", "started", "ended"):
        jobs.add_column(column)
    for job in d["jobs"][-8:]:
        nodes = job.get("nodes") or []
        jobs.add_row(  # Table cells are rich markup: escape (a reason may hold "[/]" or ANSI codes)
            for_rich(job["job_id"]),
            for_rich(job.get("reason", "")),
            for_rich(job.get("state", "")),
            for_rich(job.get("outcome") or ""),
            for_rich(",".join(nodes[:4]) + ("..." if len(nodes) > 4 else "")),
            _clock(job.get("started_at")),
            _clock(job.get("ended_at")),
        )
    parts.append(jobs)

    t, c = d["training"], d["checkpoint"]
    line = Text()
    step = t["step"]
    line.append(f"step {step if step is not None else '-'}/{t['total_steps'] or '?'}  ", style="bold")
    if t["loss"] is not None:
        line.append(f"loss {t['loss']:.4f}  ")
    if t["tokens_per_s"]:
        line.append(f"{t['tokens_per_s']:,.0f} tok/s  ")
    if t["tflops_per_gpu"]:
        line.append(f"{t['tflops_per_gpu']:.2f} TFLOPs/GPU  ")
    line.append(f"ETA {_ago(t['eta_seconds'])}")
    parts.append(line)
    ck = Text(
        f"checkpoint: last step {c['last_step'] if c['last_step'] is not None else '-'}, "
        f"{_ago(c['age_seconds'])} ago"
    )
    due = c["next_due"]
    if due.get("step") is not None:
        ck.append(f"; next at step {due['step']}")
    if due.get("in_seconds") is not None:
        ck.append(f"; next by time in {_ago(due['in_seconds'])}")
    parts.append(ck)

    if d.get("goodput") and d["goodput"]["whole_run"]["goodput"] is not None:
        parts.append(Text(_goodput_line(d["goodput"])))
    parts.append(_heartbeat_grid(d))
    if d["excluded"]:
        parts.append(
            Text(
                "excluded nodes: "
                + ", ".join(
                    f"{for_terminal(n)} ({for_terminal(v.get('reason', ''))})"
                    for n, v in d["excluded"].items()
                ),
                style="yellow",
            )
        )
    else:
        parts.append(Text("excluded nodes: none"))
    events = Table(title="recent events", title_justify="left", show_header=False, pad_edge=False, box=None)
    events.add_column("time")
    events.add_column("event")
    events.add_column("detail", overflow="fold")
    for event in d["events"]:
        detail = {k: v for k, v in event.items() if k not in ("time", "event")}
        events.add_row(
            _clock(event.get("time")),
            for_rich(event.get("event", "")),
            for_rich(json.dumps(detail, default=str)[:110]),
        )
    parts.append(events)
    return Group(*parts)


def _goodput_line(goodput: dict[str, Any]) -> str:
    from orchestrator.goodput import LABELS  # noqa: PLC0415

    whole, day = goodput["whole_run"], goodput["last_24h"]
    losses = sorted(
        ((v or 0.0, k) for k, v in whole["fraction"].items() if k != "useful_training"), reverse=True
    )[:3]
    lost = ", ".join(f"{LABELS[k].split(' (')[0]} {v:.0%}" for v, k in losses if v > 0)
    return (
        f"goodput: {whole['goodput']:.1%} whole run, {day['goodput'] or 0:.1%} last 24 h"
        + (f"; lost to {lost}" if lost else "")
        + " (runctl report)"
    )


def _heartbeat_grid(d: dict[str, Any]):
    """One cell per node: its oldest rank beat. Green fresh, yellow late, red past dead_after."""
    from rich.text import Text  # noqa: PLC0415

    grid = Text(f"heartbeats (job {d['heartbeat_job'] or '-'}, oldest beat per node):\n")
    if not d["nodes"]:
        grid.append("  no heartbeats yet")
        return grid
    late = max(3 * d["heartbeat_seconds"], d["dead_after"] / 2)
    names = list(d["nodes"])
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    prefix = prefix.rstrip("0123456789")  # node01..node48 -> "node": cells show 01..48
    if prefix:
        grid.append(f"  ({prefix}NN)\n")
    width = max(len(n) - len(prefix) for n in names)
    for index, (node, info) in enumerate(d["nodes"].items()):
        age = info["age"]
        style = "green" if age < late else "yellow" if age < d["dead_after"] else "bold red"
        grid.append(f" {for_terminal(node[len(prefix) :]):>{width}} {_ago(age):>4}", style=style)
        if (index + 1) % GRID_COLUMNS == 0:
            grid.append("\n")
    return grid
