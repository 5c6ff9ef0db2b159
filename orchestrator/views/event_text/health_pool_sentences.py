"""Sentences of training health (controller/health_policy.py) and of the node pool and SLURM's word (controller/pool.py, stalls.py, jobs.py)."""

from __future__ import annotations

from orchestrator.contract import health_events as hev
from orchestrator.contract import pool_events as pev
from orchestrator.contract.causes import cause_words
from orchestrator.views.event_text.registry import says
from orchestrator.views.event_text.words import (
    _by,
    _g,
    _job,
    _n,
    _nodes,
    _ranges,
    _reason,
    _step,
    duration,
)

# -- training health (controller/health_policy.py) -----------------------------------------------------


@says(hev.HealthFinding)
def _(e: hev.HealthFinding) -> str:
    return (
        f"training health: {e.finding} from step {_n(e.onset_step)} (met at {_n(e.met_step)}): "
        f"{_g(e.measured)} against {_trend_word(e)}{_g(e.baseline)}, limit {_g(e.limit)}{_spreads(e)}; "
        f"policy {_n(e.policy)}{_reason(e.message)}"
    )


def _trend_word(e: hev.HealthFinding) -> str:
    return "the trend " if e.trend is not None else ""


def _spreads(e: hev.HealthFinding) -> str:
    if e.spreads is None or e.residual_spread is None:
        return ""
    return f" ({_g(e.spreads)} noise spreads of {_g(e.residual_spread)})"


@says(hev.HealthPauseRequested)
def _(e: hev.HealthPauseRequested) -> str:
    return f"pause for training health: {_job(e.job_id)} asked to save and stop{_reason(e.why)}; the run waits for a person"


@says(hev.RollbackPlanned)
def _(e: hev.RollbackPlanned) -> str:
    lr = f"; learning rate x{_g(e.lr_scale)} for {_n(e.lr_scale_steps)} steps" if e.lr_scale_steps else ""
    kind = "automatic" if e.automatic else "requested"
    return (
        f"rollback planned{_by(e.by)} ({kind}, {_n(e.rollbacks_in_window)} before it in the budget's window): "
        f"to step {_n(e.to_step)}, skipping samples {_ranges(e.skip_samples)}{lr}; {_job(e.job_id)} "
        f"asked to save and stop{_reason(e.reason)}"
    )


@says(hev.RollbackRefused)
def _(e: hev.RollbackRefused) -> str:
    return f"rollback refused{_by(e.by)} ({_n(e.rollbacks_in_window)} in the budget's window){_reason(e.why)}"


@says(hev.RollbackStarted)
def _(e: hev.RollbackStarted) -> str:
    return f"rollback {e.directive_id} started: the run goes on from step {_n(e.to_step)}"


@says(hev.RollbackApplied)
def _(e: hev.RollbackApplied) -> str:
    where = _step(e.resumed_from)
    return f"rollback {e.directive_id} applied by job {e.job_id}: it resumed from {where}"


# -- the node pool and SLURM's word (controller/pool.py, stalls.py, jobs.py) ---------------------------


@says(pev.JobNotListed)
def _(e: pev.JobNotListed) -> str:
    return f"SLURM's answer did not list job {e.job_id} (last seen {e.last_state or '?'}): not taken as an end{_reason(e.why)}"


@says(pev.NodeLeftToSlurm)
def _(e: pev.NodeLeftToSlurm) -> str:
    why = f" ({e.slurm_reason})" if e.slurm_reason else ""
    return (
        f"{e.node} not excluded after {cause_words(e.cause)} in job {e.job_id}: SLURM already has it "
        f"{e.slurm_state}{why}; SLURM's admins return it"
    )


@says(pev.NodeStalled)
def _(e: pev.NodeStalled) -> str:
    then = "excluded on probation" if e.excluded else "not excluded"
    return (
        f"{e.node} stalled {_g(e.seconds)} s in job {e.job_id} and came back "
        f"({_n(e.stalls_in_window)} stall(s) in {_g(e.window_hours)} h): {then}"
    )


@says(pev.ProbationEnded)
def _(e: pev.ProbationEnded) -> str:
    return f"back in the pool: {_nodes(e.nodes)}{_reason(e.why)}; still excluded: {_nodes(e.excluded)}"


@says(pev.PoolShort)
def _(e: pev.PoolShort) -> str:
    if e.message:  # the controller's own account: the counts, the nodes by reason and the advice
        return f"CRITICAL: the node pool is short for the next job (policy {e.policy}): {e.message}"
    return (
        f"CRITICAL: the node pool is short, {_n(e.usable)} usable of the {_n(e.needed)} the next job needs (of {_n(e.pool)}; "
        f"excluded {_nodes(e.excluded)}, down {_nodes(e.down)}, drained {_nodes(e.drained)}, reserved "
        f"{_nodes(e.reserved)}); policy {e.policy}{_reason(e.message)}"
    )


@says(pev.SparesForNextJob)
def _(e: pev.SparesForNextJob) -> str:
    if e.spares_next is not None and e.spares is not None and e.spares_next >= e.spares:
        return f"the next job asks for its {_n(e.spares)} spare node(s) again: {_n(e.usable)} usable nodes"
    return (
        f"the next job asks for {_n(e.spares_next)} spare node(s) instead of {_n(e.spares)}: "
        f"{_n(e.usable)} usable nodes, {_n(e.nodes)} to train; it can start, with less room to replace a node"
    )


@says(pev.PoolRecovered)
def _(e: pev.PoolRecovered) -> str:
    after = f" after {duration(e.short_for_seconds)}" if e.short_for_seconds is not None else ""
    return f"the node pool fits again{after}: {_n(e.usable)} usable of {_n(e.needed)} needed"


@says(pev.SubmissionRefused)
def _(e: pev.SubmissionRefused) -> str:
    return (
        f"SLURM refused the next job with --exclude={','.join(e.exclude) or '(none)'} (too few nodes left "
        f"to run it): probation ended early for {_nodes(e.returned)}{_reason(e.why)}; submitting again"
    )
