"""Where the wall time of a run went: a breakdown that adds up to the wall time, exactly.

    bd = run_breakdown(run_dir)                 # whole run and the last 24 h, from the run directory
    bd = breakdown(timeline, start, end)        # pure: the same from plain data (tests build one by hand)

Every second between the first submission and the end (the run's stop, else now) is charged to
exactly one category, by painting intervals with a priority (higher wins where they overlap):

  3 detection_wait    [failure_time, detection_time] of each failure the controller recorded: the
                      job was dead or hung and nobody knew yet
  2 (inside a job, from SLURM's start to its end; the trainer's metrics.jsonl lines split it)
    init_rendezvous   job start -> first step's start (srun, imports, rendezvous, model build),
                      and the shutdown after the last step / last save
    checkpoint_load   the end of that startup: `checkpoint_load_seconds` the trainer reported
                      (the controller records it in a `job_training` event)
    checkpoint_save   after step k, until the checkpoint of step k became complete (its manifest's
                      time; the controller records `checkpoint_complete` events, which outlive
                      keep-last cleanup; manifests still on disk are used too)
    eval              a step line with `eval_loss`: the line's interval minus its step_seconds
    useful_training   a step's interval (previous line's end or save end -> this line's end) when
                      the step survived
    recomputed_steps  the same for a step whose work was lost: a later line redid that step, or a
                      later restart resumed from an earlier checkpoint
  1 queue_wait        a job of the run was pending (submitted, not started)
  0 no_job            nothing at all: the controller was deciding, the run was stopped, or down

Clocks: metrics times are rank 0's node clock, job start/end SLURM's, events the login node's;
NTP keeps them within seconds, which is noise against hours of accounting, and the painting
makes a small overlap harmless (it is charged once, to the higher priority).
Cost: one pass over metrics.jsonl (about 25k lines a month at BLOOM's 105 s steps).
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.contract import MANIFEST_NAME, ContractError, RunPaths, read_metrics, step_of
from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.events import read_events
from orchestrator.contract.state import ControllerState, load_state

DAY_SECONDS = 86400.0
CLOCK_SKEW_SECONDS = 60.0  # a save that ends this much after the next step's start is still its save
# Painting order: the first category in this list wins where intervals overlap.
CATEGORIES = (
    "detection_wait",
    "checkpoint_save",
    "checkpoint_load",
    "eval",
    "recomputed_steps",
    "useful_training",
    "init_rendezvous",
    "queue_wait",
    "no_job",
)
LABELS = {
    "useful_training": "useful training",
    "queue_wait": "queue wait",
    "init_rendezvous": "init, rendezvous and shutdown",
    "checkpoint_save": "checkpoint save stall",
    "checkpoint_load": "checkpoint load",
    "recomputed_steps": "recomputed steps (work lost to failures)",
    "eval": "evaluation",
    "detection_wait": "detection wait (failed or hung, not noticed yet)",
    "no_job": "no job queued or running",
}


@dataclass
class Job:
    job_id: str
    submitted_at: float
    started_at: float | None = None
    ended_at: float | None = None
    checkpoint_load_seconds: float = 0.0


@dataclass
class StepLine:
    step: int
    time: float  # when the line was written: end of the step (and of its eval, if any)
    step_seconds: float
    eval: bool = False
    job_id: str | None = None


@dataclass
class Timeline:
    """Everything the breakdown needs, as plain data (times in epoch seconds)."""

    jobs: list[Job] = field(default_factory=list)
    steps: list[StepLine] = field(default_factory=list)
    saves: list[tuple[int, float]] = field(default_factory=list)  # (step, complete at)
    failures: list[tuple[float, float]] = field(default_factory=list)  # (failure, detection)
    resumes: list[tuple[float, int]] = field(default_factory=list)  # (restart time, resume step)


@dataclass
class Breakdown:
    start: float
    end: float
    seconds: dict[str, float]
    segments: list[tuple[float, float, str]]  # painted, merged, in time order

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def goodput(self) -> float | None:
        return self.seconds["useful_training"] / self.wall if self.wall > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "wall_seconds": self.wall,
            "goodput": self.goodput,
            "seconds": dict(self.seconds),
            "fraction": {k: (v / self.wall if self.wall > 0 else None) for k, v in self.seconds.items()},
        }


# -- the pure part -------------------------------------------------------------------------------
def breakdown(tl: Timeline, start: float, end: float) -> Breakdown:
    """Charge every second of [start, end] to one category (see the module docstring)."""
    spans: list[tuple[float, float, str]] = []
    lost = _lost_lines(tl)
    saves: dict[int, list[float]] = {}
    for step, done in tl.saves:
        saves.setdefault(step, []).append(done)
    for times in saves.values():
        times.sort()
    ordered = sorted(tl.steps, key=lambda s: s.time)
    times = [s.time for s in ordered]
    for failure, detection in tl.failures:
        spans.append((failure, detection, "detection_wait"))
    for job in tl.jobs:
        began = job.started_at if job.started_at is not None else job.ended_at
        spans.append((job.submitted_at, began if began is not None else end, "queue_wait"))
        if job.started_at is not None:
            job_end = job.ended_at if job.ended_at is not None else end
            window = ordered[bisect.bisect_left(times, job.started_at) : bisect.bisect_right(times, job_end)]
            lines = [s for s in window if s.job_id in (None, job.job_id)]
            lines += [
                s for s in ordered if s.job_id == job.job_id and not job.started_at <= s.time <= job_end
            ]
            spans += _job_spans(job, sorted(lines, key=lambda s: s.time), saves, job_end, lost)
    return _paint(spans, start, end)


def _job_spans(
    job: Job, lines: list[StepLine], saves: dict[int, list[float]], job_end: float, lost: set[int]
) -> list[tuple[float, float, str]]:
    spans: list[tuple[float, float, str]] = []
    if not lines:
        return _startup(job, job_end, spans)
    first = lines[0]
    _startup(job, first.time - first.step_seconds, spans)
    cursor = first.time - first.step_seconds
    previous: StepLine | None = None
    for line in lines:
        if previous is not None:
            cursor = _save_after(previous, line.time - line.step_seconds, saves, spans)
        category = "recomputed_steps" if id(line) in lost else "useful_training"
        if line.eval:
            step_start = max(cursor, line.time - line.step_seconds)
            spans.append((cursor, step_start, "eval"))
            cursor = step_start
        spans.append((cursor, line.time, category))
        cursor, previous = line.time, line
    tail = _save_after(previous, job_end, saves, spans)
    spans.append((tail, job_end, "init_rendezvous"))
    return spans


def _startup(job: Job, until: float, spans: list) -> list:
    began = job.started_at
    load_from = max(began, until - max(0.0, job.checkpoint_load_seconds))
    spans.append((began, load_from, "init_rendezvous"))
    spans.append((load_from, until, "checkpoint_load"))
    return spans


def _save_after(line: StepLine, limit: float, saves: dict[int, list[float]], spans: list) -> float:
    """The save of `line`'s step right after it, if one completed before `limit` (give or take
    CLOCK_SKEW_SECONDS: the manifest's mtime and the metrics line come from different clocks);
    returns where the next interval starts."""
    times = saves.get(line.step, [])
    index = bisect.bisect_right(times, line.time)
    if index == len(times) or times[index] > limit + CLOCK_SKEW_SECONDS:
        return line.time
    done = min(times[index], limit)
    spans.append((line.time, done, "checkpoint_save"))
    return done


def _lost_lines(tl: Timeline) -> set[int]:
    """Lines whose work did not survive: redone by a later line, or behind a later resume."""
    ordered = sorted(tl.steps, key=lambda s: s.time)
    lost: set[int] = set()
    lowest_later = float("inf")
    for line in reversed(ordered):
        if lowest_later <= line.step:
            lost.add(id(line))
        lowest_later = min(lowest_later, line.step)
    # The lowest resume step of any restart at or after each line (suffix minimum over time).
    resumes = sorted(tl.resumes)
    lowest_resume = [float("inf")] * (len(resumes) + 1)
    for index in range(len(resumes) - 1, -1, -1):
        lowest_resume[index] = min(lowest_resume[index + 1], resumes[index][1])
    restart_times = [r[0] for r in resumes]
    for line in ordered:
        if line.step > lowest_resume[bisect.bisect_left(restart_times, line.time)]:
            lost.add(id(line))
    return lost


def _paint(spans: Iterable[tuple[float, float, str]], start: float, end: float) -> Breakdown:
    """Sweep the boundaries; each elementary interval goes to the first active category in
    CATEGORIES order, else to no_job."""
    rank = {name: i for i, name in enumerate(CATEGORIES)}
    changes: list[tuple[float, int, int]] = []
    for begin, finish, category in spans:
        begin, finish = max(begin, start), min(finish, end)
        if finish > begin:
            changes += [(begin, rank[category], 1), (finish, rank[category], -1)]
    changes.sort()
    active = [0] * len(CATEGORIES)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    segments: list[tuple[float, float, str]] = []
    cursor = start
    index = 0
    while cursor < end:
        while index < len(changes) and changes[index][0] <= cursor:
            active[changes[index][1]] += changes[index][2]
            index += 1
        upto = changes[index][0] if index < len(changes) else end
        upto = min(upto, end)
        category = next((CATEGORIES[i] for i, n in enumerate(active) if n > 0), "no_job")
        seconds[category] += upto - cursor
        if segments and segments[-1][2] == category and segments[-1][1] == cursor:
            segments[-1] = (segments[-1][0], upto, category)
        else:
            segments.append((cursor, upto, category))
        cursor = upto
    return Breakdown(start, max(start, end), seconds, segments)


# -- reading a run directory ----------------------------------------------------------------------
_CACHE: dict[tuple[str, str], tuple[tuple, tuple[Timeline, RunRecords]]] = {}  # one entry per run


def _cached_timeline(paths: RunPaths, checkpoints_dir: Path | None) -> tuple[Timeline, RunRecords]:
    """timeline_of, parsed again only when one of its files changed: the dashboard and the metrics
    exporter ask on every refresh, and a month of metrics.jsonl is ~100k lines."""
    ckpt = Path(checkpoints_dir or paths.checkpoints)
    key = tuple(_stat(p) for p in (paths.state, paths.events, paths.metrics, ckpt))
    where = (str(paths.root), str(ckpt))
    cached = _CACHE.get(where)
    if cached is None or cached[0] != key:
        _CACHE[where] = (key, timeline_of(paths, checkpoints_dir))
    return _CACHE[where][1]


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns  # a rename (atomic write) changes the inode


def timeline_of(paths: RunPaths, checkpoints_dir: Path | None = None) -> tuple[Timeline, RunRecords]:
    """The Timeline of a run from state.json, events.jsonl, metrics.jsonl and the manifests, and
    the records it came from (for the window's end)."""
    try:
        state = load_state(paths)
    except ContractError:
        state = ControllerState()
    events = read_events(paths.events)
    loads: dict[str, float] = {}  # per job, summed over its launches (a job with spares relaunches)
    for e in events:
        if isinstance(e, ev.JobTraining):
            loads[e.job_id] = loads.get(e.job_id, 0.0) + (e.checkpoint_load_seconds or 0.0)
    tl = Timeline()
    for job in state.jobs:
        tl.jobs.append(
            Job(job.job_id, job.submitted_at, job.started_at, job.ended_at, loads.get(job.job_id, 0.0))
        )
    for line in read_metrics(paths.metrics):
        if line.time:
            tl.steps.append(
                StepLine(
                    line.step, line.time, line.step_seconds or 0.0, line.eval_loss is not None, line.job_id
                )
            )
    for event in events:
        if isinstance(event, (fev.Failure, fev.Restart)) and event.failure_time is not None:
            detected = event.detection_time if event.detection_time is not None else event.time
            if detected is not None:
                tl.failures.append((event.failure_time, detected))
        if isinstance(event, fev.Restart):
            tl.resumes.append(
                (
                    event.restart_time if event.restart_time is not None else event.time or 0.0,
                    event.resume_step,
                )
            )
        if isinstance(event, ev.CheckpointComplete) and event.saved_at is not None:
            tl.saves.append((event.step, event.saved_at))
    tl.saves += _manifest_saves(checkpoints_dir or paths.checkpoints)
    return tl, RunRecords(state, events)


def _manifest_saves(ckpt_dir: Path) -> list[tuple[int, float]]:
    out = []
    try:
        names = os.listdir(ckpt_dir)
    except OSError:
        return out
    for name in names:
        step = step_of(name)
        if step is None:
            continue
        try:
            out.append((step, (Path(ckpt_dir) / name / MANIFEST_NAME).stat().st_mtime))
        except OSError:
            continue
    return out


@dataclass
class RunRecords:
    state: ControllerState
    events: list[ev.Event]


def run_window(tl: Timeline, raw: RunRecords, now: float) -> tuple[float, float]:
    """[first submission, end]: the end is when the run stopped (its last job's end or the
    run_stopped event, whichever is later) when it is stopped, else now."""
    starts = [j.submitted_at for j in tl.jobs]
    if not starts:
        return now, now
    start = min(starts)
    if raw.state.status.stopped:
        stops = [e.time for e in raw.events if isinstance(e, fev.RunStopped) and e.time is not None]
        ends = [j.ended_at for j in tl.jobs if j.ended_at is not None]
        candidates = [*stops[-1:], *ends]
        if candidates:
            return start, max(start, max(candidates))
    return start, max(start, now)


def run_breakdown(
    run_dir: str | os.PathLike[str],
    now: float | None = None,
    window_seconds: float = DAY_SECONDS,
    checkpoints_dir: Path | None = None,
) -> dict[str, Any]:
    """{"whole_run": Breakdown.as_dict(), "last_24h": ..., "segments": [...]} of a run directory."""
    paths = RunPaths.of(run_dir)
    tl, raw = _cached_timeline(paths, checkpoints_dir)
    start, end = run_window(tl, raw, now if now is not None else time.time())
    whole = breakdown(tl, start, end)
    recent = breakdown(tl, max(start, end - window_seconds), end)
    return {
        "whole_run": whole.as_dict(),
        "last_24h": recent.as_dict(),
        "window_seconds": window_seconds,
        "segments": [[a, b, c] for a, b, c in whole.segments],
    }


def format_breakdown(part: dict[str, Any]) -> list[str]:
    """Lines for people: each category with its hours and share, largest first."""
    wall = part["wall_seconds"] or 0.0
    lines = []
    for name, seconds in sorted(part["seconds"].items(), key=lambda kv: -kv[1]):
        if seconds <= 0:
            continue
        share = seconds / wall if wall else 0.0
        lines.append(f"{LABELS[name]:<48} {_hms(seconds):>10}  {share:6.1%}")
    return lines


def _hms(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


__all__ = [
    "CATEGORIES", "LABELS", "Breakdown", "Job", "StepLine", "Timeline", "breakdown",
    "format_breakdown", "run_breakdown", "timeline_of",
]  # fmt: skip
