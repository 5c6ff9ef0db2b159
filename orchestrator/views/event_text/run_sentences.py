"""Sentences of the controller itself, jobs, failures and recovery."""

from __future__ import annotations

from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.causes import Cause, cause_words
from orchestrator.contract.interval import CheckpointIntervalFit
from orchestrator.views.event_text.registry import says
from orchestrator.views.event_text.words import _by, _g, _n, duration, hosts, outcome_words


# -- the controller itself ------------------------------------------------------------------------
@says(ev.ControllerStarted)
def _(e: ev.ControllerStarted) -> str:
    jobs = f"; jobs {', '.join(e.jobs)}" if e.jobs else "; no job yet"
    return f"controller started (run {e.status}{jobs})"


@says(ev.PermissionsWarning)
def _(e: ev.PermissionsWarning) -> str:
    return f"permissions: {e.message}"


@says(ev.PassFailed)
def _(e: ev.PassFailed) -> str:
    where = f" in {e.where}" if e.where else ""
    return (
        f"controller pass failed{where} ({_n(e.passes_failed_in_a_row)} in a row; next try in "
        f"{duration(e.retry_in_seconds)}): {e.error}"
    )


@says(ev.PassRecovered)
def _(e: ev.PassRecovered) -> str:
    return f"controller passes work again after {_n(e.after_failed_passes)} failed one(s)"


@says(ev.StateNotSaved)
def _(e: ev.StateNotSaved) -> str:
    return f"state.json not saved: {e.error}"


@says(ev.Notified)
def _(e: ev.Notified) -> str:
    return f"notification sent: {e.kind}"


@says(ev.NotificationFailed)
def _(e: ev.NotificationFailed) -> str:
    return f"notification {e.kind} not sent: {e.problem}"


# -- jobs -------------------------------------------------------------------------------------------
@says(ev.JobAdopted)
def _(e: ev.JobAdopted) -> str:
    return f"job {e.job_id} adopted: {e.why}"


@says(ev.JobSubmitted)
def _(e: ev.JobSubmitted) -> str:
    excluding = f", excluding {hosts(e.exclude)}" if e.exclude else ""
    return f"job {e.job_id} submitted ({e.reason}{excluding})"


@says(ev.JobRequeued)
def _(e: ev.JobRequeued) -> str:
    return f"SLURM requeued job {e.job_id} ({e.state}; requeue {_n(e.requeues)})"


@says(ev.JobEnded)
def _(e: ev.JobEnded) -> str:
    code = "no exit code" if e.exit_code is None else f"exit {e.exit_code}"
    return f"job {e.job_id} ended: {outcome_words(e.outcome, e.exit_code)} ({e.state}, {code})"


@says(ev.JobsCancelled)
def _(e: ev.JobsCancelled) -> str:
    return f"cancelled job(s) {', '.join(e.job_ids)}: {e.why}"


@says(ev.IntentExpired)
def _(e: ev.IntentExpired) -> str:
    why = e.intent.get("reason") if isinstance(e.intent, dict) else None
    return (
        f"a submission{f' ({why})' if why else ''} that never reached the scheduler was dropped "
        "(nothing runs twice)"
    )


@says(ev.SchedulerUnreachable)
def _(e: ev.SchedulerUnreachable) -> str:
    return f"scheduler unreachable: {e.error}"


@says(ev.SchedulerReachable)
def _(e: ev.SchedulerReachable) -> str:
    return f"scheduler reachable again after {duration(e.after_seconds)}"


@says(ev.Continue)
def _(e: ev.Continue) -> str:
    return f"job {e.job_id}: {e.why}; the next job of the chain goes on"


@says(ev.JobTraining)
def _(e: ev.JobTraining) -> str:
    parts = [f"job {e.job_id} training"]
    if e.launch:
        parts.append(f"(launch {e.launch})")  # the launcher's numbering, as the restart's words
    parts.append(f"resumed from step {e.resumed_from}" if e.resumed_from is not None else "from the start")
    took = []
    if e.init_seconds is not None:
        took.append(f"init {duration(e.init_seconds)}")
    if e.checkpoint_load_seconds is not None:
        took.append(f"checkpoint load {duration(e.checkpoint_load_seconds)}")
    return " ".join(parts) + (f"; {', '.join(took)}" if took else "")


@says(CheckpointIntervalFit)
def _(e: CheckpointIntervalFit) -> str:
    def hours(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f} h"

    verb = "applied" if e.adaptive_mode == "apply" else "suggested"
    return (
        f"checkpoint interval {verb}: {hours(e.interval_hours)} (was {hours(e.previous_hours)}; Young/Daly "
        f"{hours(e.young_daly_hours)} for {_n(e.failures)} failures in {duration((e.exposure_hours or 0) * 3600)} "
        f"of jobs, job MTBF {_g(e.posterior_job_mtbf_hours)} h against the plan's {_g(e.prior_job_mtbf_hours)} h, "
        f"save stall {duration(e.save_stall_seconds)}; {e.evidence})"
    )


# -- failures and recovery --------------------------------------------------------------------------
@says(fev.JobWideStall)
def _(e: fev.JobWideStall) -> str:
    return (
        f"job {e.job_id}: {_n(e.ranks_stalled)} of {_n(e.world_size)} ranks stalled at once; waiting "
        f"{duration(e.waiting_seconds)} before blaming nodes ({e.why})"
    )


def _findings(e: fev.Failure) -> tuple[str, float | None, float | None]:
    """The hosts of the sampled findings, their longest age and the limit (Failure.ranks holds
    detection.Finding.as_dict(): host, age_seconds, limit_seconds)."""
    sample = [r for r in e.ranks if isinstance(r, dict)]
    names = sorted({str(r.get("host")) for r in sample if r.get("host")})
    ages = [r.get("age_seconds") for r in sample if isinstance(r.get("age_seconds"), (int, float))]
    limits = [r.get("limit_seconds") for r in sample if isinstance(r.get("limit_seconds"), (int, float))]
    return (hosts(names) if names else "", max(ages, default=None), max(limits, default=None))


def _ranks(e: fev.Failure) -> str:
    count = e.ranks_affected if e.ranks_affected is not None else len(e.ranks)
    return f"{count} rank(s)"


def _suspects(e: fev.Failure) -> str:
    """A hang's ranks behind the others (detection.behind), or why nobody is named."""
    named = [s for s in e.suspects if isinstance(s, dict)]
    if named:
        ranks = ", ".join(f"rank {s.get('rank', '?')} on {s.get('host') or '?'}" for s in named[:4])
        more = f" (+{len(named) - 4} more)" if len(named) > 4 else ""
        return f"; behind: {ranks}{more}{f' ({e.suspects_why})' if e.suspects_why else ''}"
    return f"; {e.suspects_why}" if e.suspects_why else ""


@says(fev.Failure)
def _(e: fev.Failure) -> str:
    where, age, limit = _findings(e)
    at = f" at step {e.last_step}" if e.last_step is not None else ""
    if e.cause == Cause.DEAD_RANK:
        return (
            f"{where or _ranks(e)} lost in job {e.job_id}{at} (no beat for {duration(age)}, "
            f"dead after {duration(limit)}; {_ranks(e)})"
        )
    if e.cause == Cause.MISSING_RANK:
        return f"job {e.job_id}: {_ranks(e)} never beat{f' on {where}' if where else ''} within {duration(limit)}"
    if e.cause == Cause.HANG:
        return (
            f"job {e.job_id} hung{at}: {_ranks(e)}{f' on {where}' if where else ''} made no progress "
            f"for {duration(age)} (limit {duration(limit)}){_suspects(e)}"
        )
    if e.cause == Cause.JOB_STALL:
        return f"job {e.job_id} stalled{at}: {_ranks(e)} stopped at once (the job, not a node, is suspected)"
    code = f"exit {e.exit_code}" if e.exit_code is not None else "no exit code"
    srun = f"; srun: {e.srun_says}" if e.srun_says else ""
    srun += f"; {e.rank_error}" if e.rank_error else ""
    on = f" on {e.host}" if e.host else ""
    if e.cause == Cause.LAUNCH_FAILED:
        launch = f"launch {e.launch}" if e.launch is not None else "a launch"  # 0: the first
        nodes = f" (nodes {hosts(e.nodes)})" if e.nodes else ""
        return f"{launch} of job {e.job_id} failed{on}{at} ({code}){nodes}{srun}"
    return f"job {e.job_id} failed{on}{at} ({cause_words(e.cause)}, {code}){srun}"


@says(fev.Restart)
def _(e: fev.Restart) -> str:
    where = f"inside job {e.job_id}" if e.in_allocation else f"as job {e.job_id}"
    failed = f" in job {e.failed_job_id}" if e.failed_job_id != e.job_id else ""
    lost = f", {e.work_lost_steps} step(s) lost" if e.work_lost_steps else ""
    # The controller's `how` of a relaunch starts with where it happens, said already.
    how = e.how.removeprefix(f"inside job {e.job_id}: ")
    return f"restarting {where} from step {_n(e.resume_step)} after {cause_words(e.cause)}{failed}{lost}" + (
        f"; {how}" if how else ""
    )


@says(fev.FirstStepAfterRestart)
def _(e: fev.FirstStepAfterRestart) -> str:
    return (
        f"training again in job {e.job_id} at step {_n(e.step)} (resumed from {_n(e.resumed_from)}), "
        f"{duration(e.seconds_since_failure)} after the failure"
    ) + (f"; read {read}" if (read := _read_from(e.restore_bytes)) else "")


def _read_from(restore_bytes: dict[str, float]) -> str:
    return ", ".join(
        f"{value / 1e6:.1f} MB from {where}"
        for where, value in sorted(restore_bytes.items())
        if isinstance(value, (int, float))
    )


@says(fev.CheckpointCopyDropped)
def _(e: fev.CheckpointCopyDropped) -> str:
    return f"dropped a checkpoint copy at the restart of job {e.job_id}: {e.copy}"


@says(fev.RelaunchNotPossible)
def _(e: fev.RelaunchNotPossible) -> str:
    return f"job {e.job_id} cannot restart inside itself: {e.why}"


@says(fev.NodeProbed)
def _(e: fev.NodeProbed) -> str:
    if e.before_first_beat:
        return f"asked {e.node}, whose ranks have not beaten since job {e.job_id}'s launch: {e.verdict} ({e.why})"
    if e.early and e.verdict != "lost":
        return f"asked {e.node}, a beat late in job {e.job_id}: {e.verdict} ({e.why}); asked again if it stays silent"
    return f"asked {e.node}, silent in job {e.job_id}: {e.verdict} ({e.why})"


@says(fev.ExclusionCapped)
def _(e: fev.ExclusionCapped) -> str:
    return f"not excluding {hosts(e.nodes)} after {cause_words(e.cause)} in job {e.job_id}: {e.why}"


@says(fev.NodesExcluded)
def _(e: fev.NodesExcluded) -> str:
    return f"excluded {hosts(e.nodes)} after {cause_words(e.cause)} in job {e.job_id} (excluded now: {hosts(e.excluded)})"


@says(fev.ExcludeFailed)
def _(e: fev.ExcludeFailed) -> str:
    return f"could not exclude {hosts(e.nodes)}: {e.error}"


@says(fev.NodesUnhealthy)
def _(e: fev.NodesUnhealthy) -> str:
    found = "; ".join(f"{node}: {why}" for node, why in sorted(e.nodes.items()))
    after = f" (excluded: {hosts(e.excluded)})" if e.excluded else ""
    why_not = f"; not excluded: {e.why_not}" if e.why_not else ""
    return f"health check of job {e.job_id} failed on {len(e.nodes)} node(s): {found}{after}{why_not}"


@says(fev.AllocationUnreadable)
def _(e: fev.AllocationUnreadable) -> str:
    return f"job {e.job_id}: allocation.json unreadable: {e.error}"


@says(fev.RunStopped)
def _(e: fev.RunStopped) -> str:
    return f"run stopped ({e.status}){_by(e.by)}: {e.message}"


@says(fev.StacksDumped)
def _(e: fev.StacksDumped) -> str:
    text = (
        f"stacks of job {e.job_id}: {e.ranks_answered} of {e.ranks_expected} ranks answered; "
        f"python stacks: {e.directory}/ ({len(e.files)} file(s))"
    )
    if e.flight_recorder:
        text += (
            f"; NCCL flight recorder ({len(e.flight_recorder)} rank dump(s)): "
            f"{e.directory}/{e.flight_recorder[0]} ..."
        )
    return text


@says(fev.StacksNotDumped)
def _(e: fev.StacksNotDumped) -> str:
    return f"stacks of job {e.job_id} not dumped: {e.error}"


def _score(e: fev.StragglerChange) -> str:
    return f"{e.score:.2f}x" if e.score is not None else "?"


@says(fev.Straggler)
def _(e: fev.Straggler) -> str:
    threshold = f"{e.threshold:g}x" if e.threshold is not None else "?"
    return (
        f"{e.node} is a straggler in job {e.job_id}: compute time {_score(e)} its peers' or its own "
        f"usual (threshold {threshold}) for {duration(e.slow_for_seconds)}{_straggler_advice(e.excluded_next)}"
    )


def _straggler_advice(excluded_next: bool | None) -> str:
    if excluded_next is None:
        return ""
    then = (
        "it will be left out of the next job"
        if excluded_next
        else "if it stays slow, have it drained (docs/oncall.md, Stragglers)"
    )
    return f"; every rank waits for it: {then}"


@says(fev.StragglerRecovered)
def _(e: fev.StragglerRecovered) -> str:
    return f"{e.node} is no longer a straggler in job {e.job_id} (score {_score(e)})"
