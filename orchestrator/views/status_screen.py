"""`runctl status` (and the `watch`/`status --follow` live views) for people: the facts of
`dashboard.status_data` (a views.status_view.StatusView), in words, laid out by rich to fit the
terminal (80 columns and up).

Nothing here truncates by hand: long cells wrap inside their column (Table overflow/ratio),
short facts flow into as many columns as fit (Columns), warnings wrap inside a Panel and are
never cut. Every text another user may have written goes through textsafe, and reaches rich as
Text, never as markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.columns import Columns
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from orchestrator.contract import JobState
from orchestrator.contract.codes import ExitCode
from orchestrator.contract.events import Event
from orchestrator.contract.state import RunStatus
from orchestrator.contract.textsafe import for_terminal
from orchestrator.views.event_text import clock, duration, hosts, outcome_words, sentence, size
from orchestrator.views.status_view import Dashboard, Goodput, StatusView

if TYPE_CHECKING:  # operate.runs pulls in the config models; the screen only reads its rows
    from orchestrator.operate.runs import JobRow

LISTED_ONE_BY_ONE = 4  # more late nodes than this are listed as one host list
STATUS_STYLE = {
    "running": "green",
    "finished": "bold green",
    "killed": "yellow",
    "killing": "yellow",
    "crash_loop": "bold red",
    "restarting": "magenta",
    "waiting": "cyan",
    "config_error": "bold red",
    "pausing": "yellow",
    "paused_for_health": "bold yellow",
    "rolling_back": "magenta",
    "disk_full": "bold red",
}
JOB_STATE_STYLE = {
    "running": "green",
    "pending": "cyan",
    "held": "yellow",
    "failed": "red",
    "node_fail": "red",
    "killed": "yellow",
}
# SLURM's pending reasons that people meet most, in words (others are shown as SLURM says them).
PENDING_WORDS = {
    "Dependency": "waits for the job before it (singleton)",
    "Priority": "queued: other jobs go first",
    "Resources": "queued: waiting for free nodes",
    "JobHeldUser": "held (scontrol release)",
    "BeginTime": "waits for its begin time",
    "ReqNodeNotAvail": "queued: a requested node is unavailable",
}


def render_status(data: StatusView) -> RenderableType:
    d = data.dashboard
    now = data.now
    parts: list[RenderableType] = [*_header(data)]
    if data.warnings:  # first: a live view taller than the terminal is cut at the bottom
        parts.append(_warnings(data.warnings))
    parts += [_section("jobs"), job_table(data.jobs, now)]
    parts += [_section("training"), *_training(d)]
    parts += [_section(f"heartbeats (job {for_terminal(d.heartbeat_job or '-')})"), _heartbeats(d)]
    parts += [_section("recent events"), events_table(d.events, now)]
    stragglers = straggler_table(data.stragglers)
    if stragglers is not None:
        parts += [_section(stragglers[0]), stragglers[1]]
    return Group(*parts)


def _section(title: str) -> Text:
    return Text(f"\n{title}", style="bold")


def _header(data: StatusView) -> list[Text]:
    d = data.dashboard
    title = Text()
    title.append(for_terminal(data.name), style="bold")
    title.append("  ")
    title.append(d.status.upper(), style=STATUS_STYLE.get(d.status, "white"))
    if d.stop_message:  # why it stopped, on the line people read first (a kill's reason)
        title.append(f": {for_terminal(d.stop_message)}", style=STATUS_STYLE.get(d.status, "white"))
    title.append(f"  restarts so far: {d.restarts}")
    where = Text(f"run directory {for_terminal(data.run_dir)}", overflow="fold")
    holder = d.controller
    if holder is not None:
        who = Text(
            f"controller: pid {holder.get('pid')} on {for_terminal(holder.get('host'))}", style="green"
        )
    else:
        who = Text("controller: not running", style="green" if RunStatus(d.status).stopped else "red")
    if d.last_pass_age is not None:
        who.append(f" (last pass {duration(d.last_pass_age)} ago)", style="default")
    return [title, where, who]


def job_table(rows: Sequence[JobRow], now: float) -> RenderableType:
    """One row per job of the run, oldest first: why it exists, its state, its nodes as a host
    list, when it ran, and what its end meant (or why it waits), in words."""
    if not rows:
        return Text("no job submitted yet")
    # Natural widths; when the terminal is narrower, rich wraps the text columns (never the job
    # id or the state), and folds a host list too long for its column.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("job", no_wrap=True)
    table.add_column("why", overflow="fold")
    table.add_column("state", no_wrap=True)
    table.add_column("nodes", overflow="fold")
    table.add_column("when", min_width=len("since 11:52 (2.2 h)"))
    table.add_column("outcome", overflow="fold")
    for row in rows:
        state = shown_state(row)
        table.add_row(
            Text(for_terminal(row.job_id)),
            Text(for_terminal(row.why or row.submit_reason or "-")),
            Text(for_terminal(state) + ("?" if row.stale else ""), style=JOB_STATE_STYLE.get(state, "")),
            Text(for_terminal(hosts(row.nodes) if row.nodes else "-")),
            Text(_when(row, now)),
            Text(for_terminal(_job_outcome(row))),
        )
    return table


def shown_state(row: JobRow) -> str:
    """SLURM's state, except that a job the kill switch stopped (it saved and exited 17, which
    SLURM calls FAILED) reads as killed."""
    if row.state == JobState.FAILED.value and row.exit_code == ExitCode.KILLED:
        return "killed"
    return row.state


def _when(row: JobRow, now: float) -> str:
    """When it ran, or how long it has waited, in words."""
    started, ended, submitted = row.started_at, row.ended_at, row.submitted_at
    if started and ended:
        return f"ended {clock(ended, now)} after {duration(ended - started)}"
    if started:
        return f"since {clock(started, now)} ({duration(now - started)})"
    if ended:
        return f"ended {clock(ended, now)}, never ran"
    if JobState.parse(row.state).is_terminal:
        return "never ran"
    return f"queued for {duration(now - submitted)}" if submitted else "-"


def _job_outcome(row: JobRow) -> str:
    state = JobState.parse(row.state)
    if state.is_terminal or row.outcome:
        return outcome_words(row.outcome, row.exit_code) or "-"
    reason = row.reason or ""
    if state in (JobState.PENDING, JobState.HELD):
        return PENDING_WORDS.get(reason, reason or "queued")
    return reason or ""


def _training(d: Dashboard) -> list[RenderableType]:
    t, c = d.training, d.checkpoint
    facts = []
    if t.step is None:
        facts.append("no step yet")
    elif t.total_steps:
        facts.append(f"step {t.step:,} of {t.total_steps:,} ({t.step / t.total_steps:.1%})")
    else:
        facts.append(f"step {t.step:,}")
    if t.loss is not None:
        facts.append(f"loss {t.loss:.4f}")
    if t.tokens_per_s:
        facts.append(f"{t.tokens_per_s:,.0f} tokens/s")
    if t.tflops_per_gpu:
        facts.append(f"{t.tflops_per_gpu:.1f} TFLOPs per GPU")
    if t.metrics_age is not None:
        facts.append(f"last step {duration(t.metrics_age)} ago")
    if t.eta_seconds is not None:
        facts.append(f"done in about {duration(t.eta_seconds)}")
    out: list[RenderableType] = [Columns([Text(f) for f in facts], padding=(0, 3))]
    if c.last_step is None:
        line = Text("no checkpoint yet")
    else:
        line = Text(f"last checkpoint: step {c.last_step:,}, {duration(c.age_seconds)} ago ({size(c.bytes)})")
    due = c.next_due
    if due.step is not None:
        line.append(f"; next at step {due.step:,}")
    if due.in_seconds is not None:
        seconds = due.in_seconds
        line.append(f"{' or' if due.step is not None else '; next'} by time in {duration(seconds)}")
        if seconds < 0:
            line.append(" (overdue)", style="yellow")
    out.append(line)
    if d.goodput and d.goodput.whole_run.goodput is not None:
        out.append(Text(goodput_line(d.goodput)))
    excluded = d.excluded
    if excluded:
        text = ", ".join(f"{n} ({v.get('reason') or 'no reason'})" for n, v in excluded.items())
        out.append(Text(f"excluded nodes: {for_terminal(text)}", style="yellow"))
    else:
        out.append(Text("excluded nodes: none"))
    return out


def goodput_line(goodput: Goodput) -> str:
    from orchestrator.views.goodput import LABELS  # noqa: PLC0415

    whole, day = goodput.whole_run, goodput.last_24h
    losses = sorted(
        ((v or 0.0, k) for k, v in whole.fraction.items() if k != "useful_training"), reverse=True
    )[:3]
    lost = ", ".join(f"{LABELS[k].split(' (')[0]} {v:.0%}" for v, k in losses if v >= 0.005)
    return (
        f"goodput: {whole.goodput:.1%} whole run, {day.goodput or 0:.1%} last 24 h"
        + (f"; lost to {lost}" if lost else "")
        + " (runctl report)"
    )


def heartbeat_lines(d: Dashboard) -> list[tuple[str, str]]:
    """(style, sentence) about the beats of the run's current job: what is late and by how much."""
    job, nodes = d.heartbeat_job, d.nodes
    if job is None:
        return [("", "no job yet, so no heartbeats")]
    if not d.heartbeat_job_running:
        if not nodes:
            return [("", f"job {job} is not running, and left no heartbeats")]
        newest = min(info.age for info in nodes.values())
        return [("", f"job {job} is not running; its last beats are {duration(newest)} old")]
    if not nodes:
        return [("yellow", f"job {job} runs but no rank has beaten yet (starting up)")]
    dead_after, late_after = d.dead_after, d.late_after
    dead = {n: i.age for n, i in nodes.items() if i.age >= dead_after}
    late = {n: i.age for n, i in nodes.items() if late_after <= i.age < dead_after}
    beating = len(nodes) - len(dead) - len(late)
    if not dead and not late:
        slowest = max(nodes, key=lambda n: nodes[n].age)
        head = f"all {len(nodes)} nodes beating; slowest {slowest}, {duration(nodes[slowest].age)} ago"
    else:
        head = f"{beating} of {len(nodes)} nodes beating on time"
    missing = d.ranks_in_job - d.ranks_beating
    if missing > 0:
        head += f"; {missing} of {d.ranks_in_job} ranks have not beaten yet"
    lines = [("" if not dead and not late and missing <= 0 else "yellow", head)]
    limit = f"dead after {duration(dead_after)}"
    lines += _late_group(dead, "bold red", f"({limit})")
    lines += _late_group(late, "yellow", f"(late after {duration(late_after)}, {limit})")
    return [(style, for_terminal(text)) for style, text in lines]


def _late_group(ages: dict[str, float], style: str, limit: str) -> list[tuple[str, str]]:
    if not ages:
        return []
    if len(ages) <= LISTED_ONE_BY_ONE:
        return [(style, f"{node}: no beat for {duration(age)} {limit}") for node, age in sorted(ages.items())]
    low, high = min(ages.values()), max(ages.values())
    return [
        (style, f"{len(ages)} nodes, {hosts(ages)}: no beat for {duration(low)} to {duration(high)} {limit}")
    ]


def _heartbeats(d: Dashboard) -> Text:
    text = Text()
    for index, (style, line) in enumerate(heartbeat_lines(d)):
        text.append(("\n" if index else "") + line, style=style)
    return text


def _warnings(items: Sequence[str]) -> Panel:
    """Each warning whole, wrapped under its own bullet; a warning of several lines (a command's
    stdout and stderr) keeps its lines, each made safe on its own, under the same bullet."""
    body = Table.grid(padding=(0, 1), expand=True)
    body.add_column(no_wrap=True)
    body.add_column(ratio=1, overflow="fold")
    for item in items:
        body.add_row("-", Text("\n".join(for_terminal(line) for line in item.splitlines() if line.strip())))
    return Panel(body, title="warnings", title_align="left", border_style="red", box=box.ROUNDED)


def events_table(events: Sequence[Event], now: float) -> RenderableType:
    """The run's last events as sentences, with their local time; a long one wraps under itself."""
    if not events:
        return Text("no events yet")
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column(no_wrap=True, style="dim")
    table.add_column(ratio=1, overflow="fold")
    for event in events:
        table.add_row(clock(event.time, now), Text(sentence(event)))
    return table


def straggler_table(scores: dict[str, Any]) -> tuple[str, Table] | None:
    """Slowest nodes first: score = compute time per step over its peers' median (vs median) or
    its own history (vs history), whichever is larger; a straggler once it stayed past the threshold."""
    nodes = scores.get("nodes") if isinstance(scores, dict) else None
    if not isinstance(nodes, dict) or not nodes:
        return None
    rows = {n: v for n, v in nodes.items() if isinstance(v, dict)}
    flagged = [n for n, v in rows.items() if v.get("straggler")]
    title = (
        f"stragglers (job {for_terminal(scores.get('job_id'))}, step {scores.get('step')}, threshold "
        f"{scores.get('threshold')}x): {for_terminal(', '.join(flagged)) or 'none'}"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("node", overflow="fold")
    for column in ("score", "vs median", "vs history", "compute s", "slow for s"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)

    def slowest_first(item: tuple[str, dict[str, Any]]) -> float:
        score = item[1].get("score")
        return -score if isinstance(score, (int, float)) else 0.0

    for node, v in sorted(rows.items(), key=slowest_first)[:10]:
        cells = [
            v.get(k) for k in ("score", "vs_median", "vs_history", "compute_seconds", "slow_for_seconds")
        ]
        table.add_row(
            Text(for_terminal(node)),
            *(f"{c:.3f}" if isinstance(c, (int, float)) else "-" for c in cells),
            Text("STRAGGLER", style="bold red") if v.get("straggler") else "",
        )
    if len(rows) > 10:
        table.caption = f"... {len(rows) - 10} more node(s) (--json for all)"
    return title, table
