"""Can a job of the run do its work inside its time limit, and every phase inside its timeout?

The planner calls `time_budget_problems` (so `runctl plan` and `runctl submit`, dry run included,
refuse alike, exit 3). Each rule catches a config that would be accepted today and fail hours
later, on every job:

1. time limit >= init + one save + the pre-timeout margin (watchdog.init_timeout_seconds +
   checkpoint.save_seconds + cluster.pre_timeout_seconds): else a job can end before it has
   started training and saved once;
2. pre-timeout margin >= one save: SLURM's signal comes pre_timeout_seconds before the limit and
   the trainer saves then; a save longer than the margin is killed by the limit and lost;
3. checkpoint interval <= time limit: else no job lives to its first periodic checkpoint, and
   any failure loses the whole job (the interval is the earlier of interval_hours and
   interval_steps x the planned step time, as the trainer saves at whichever comes first);
4. exit duration + one save <= time limit: the save at checkpoint.exit_duration_minutes must end
   before SLURM ends the job;
5. a save must finish inside watchdog.checkpoint_timeout_seconds (else every save looks like a
   hang to the controller) and, with checkpoint.interval_hours, before the next one is due (a
   save longer than that interval leaves the trainer saving after every step; interval_steps
   always trains that many steps between saves);
6. a step inside watchdog.step_timeout_seconds, an evaluation (data.eval_iters forward passes of
   the global batch, a third of a training iteration's model FLOPs each) inside
   watchdog.eval_timeout_seconds: the timeouts are floors, a phase that cannot fit one is a
   hang the controller would find on every job.

Pure arithmetic over the config and the planner's step time; every message names the keys,
their values and what to change.
"""

from __future__ import annotations

from typing import Any

from orchestrator.plan.config.slurm_time import slurm_time


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def checkpoint_interval_seconds(cfg: Any, seconds_per_iteration: float) -> tuple[float | None, str]:
    """The effective interval and the key it comes from: the earlier of interval_hours and
    interval_steps x the step time (None when neither is set, which the schema refuses)."""
    c = cfg.checkpoint
    candidates = []
    if c.interval_hours is not None:
        candidates.append((c.interval_hours * 3600, f"checkpoint.interval_hours = {c.interval_hours:g}"))
    if c.interval_steps is not None:
        candidates.append((
            c.interval_steps * seconds_per_iteration,
            f"checkpoint.interval_steps = {c.interval_steps} (x {seconds_per_iteration:.3g} s a step)",
        ))  # fmt: skip
    if not candidates:
        return None, ""
    return min(candidates)


def time_budget_problems(
    cfg: Any,
    *,
    job_seconds: float,
    save_seconds: float,
    save_source: str,
    seconds_per_iteration: float,
    forward_seconds_per_iteration: float,
    speed_source: str,
) -> list[str]:
    """Every broken rule of the module docstring, as a message with its fix.
    save_source / speed_source: where save_seconds and the step time come from (a config key or a
    `runctl plan` flag), for the messages."""
    c, w, ck = cfg.cluster, cfg.watchdog, cfg.checkpoint
    limit = f"cluster.time_limit = {c.time_limit} ({_h(job_seconds)})"
    margin = c.pre_timeout_seconds
    init = w.init_timeout_seconds
    save = f"{save_source} = {save_seconds:g}"
    problems: list[str] = []

    needed = init + save_seconds + margin
    if job_seconds < needed:
        problems.append(
            f"{limit} is shorter than init + one save + the pre-timeout margin = watchdog.init_timeout_seconds "
            f"{init:g} + {save} + cluster.pre_timeout_seconds {margin} = {needed:g} s: a job can end before it "
            f"trains and saves once. Set time_limit to at least {slurm_time(needed)} (hours more, to train)"
        )
    if margin < save_seconds:
        problems.append(
            f"cluster.pre_timeout_seconds = {margin} is shorter than one save ({save} s): the save the trainer "
            f"starts on the pre-timeout signal is killed by the time limit. Set pre_timeout_seconds to at least "
            f"{save_seconds:.0f}"
        )
    interval, interval_key = checkpoint_interval_seconds(cfg, seconds_per_iteration)
    if interval is not None and interval > job_seconds:
        problems.append(
            f"the checkpoint interval, {interval_key} = {_h(interval)}, is longer than {limit}: no job lives "
            f"to its first periodic checkpoint and a failure loses the whole job. Lower the interval below "
            f"{_h(job_seconds)} or raise time_limit"
        )
    if ck.exit_duration_minutes is not None:
        end = ck.exit_duration_minutes * 60 + save_seconds
        if end > job_seconds:
            latest = (job_seconds - save_seconds) / 60
            fix = (
                f"set exit_duration_minutes to at most {latest:.0f}"
                if latest >= 1
                else "remove exit_duration_minutes or raise time_limit"
            )
            problems.append(
                f"checkpoint.exit_duration_minutes = {ck.exit_duration_minutes:g} plus one save ({save} s) ends "
                f"at {_h(end)}, past {limit}: the trainer's exit save would be killed. {fix[0].upper()}{fix[1:]} "
                "(the pre-timeout signal already saves before the limit)"
            )
    if save_seconds > w.checkpoint_timeout_seconds:
        problems.append(
            f"one save ({save} s) is longer than watchdog.checkpoint_timeout_seconds = "
            f"{w.checkpoint_timeout_seconds:g}: every save would look like a hang and be killed. Set "
            f"checkpoint_timeout_seconds to at least {2 * save_seconds:.0f} (twice the save), or correct "
            f"{save_source} from a measured save"
        )
    if ck.interval_hours is not None and save_seconds >= ck.interval_hours * 3600:
        problems.append(
            f"one save ({save} s) takes longer than the checkpoint interval (checkpoint.interval_hours = "
            f"{ck.interval_hours:g}): the trainer would save after every step. Raise interval_hours well above "
            "the save time"
        )
    if seconds_per_iteration > w.step_timeout_seconds:
        problems.append(
            f"one training step takes {seconds_per_iteration:.0f} s at {speed_source}, longer than "
            f"watchdog.step_timeout_seconds = {w.step_timeout_seconds:g}: every step would look like a hang. "
            f"Set step_timeout_seconds to at least {3 * seconds_per_iteration:.0f}"
        )
    eval_seconds = cfg.data.eval_iters * forward_seconds_per_iteration
    if eval_seconds > w.eval_timeout_seconds:
        problems.append(
            f"one evaluation (data.eval_iters = {cfg.data.eval_iters} forward passes of the global batch) takes "
            f"{eval_seconds:.0f} s at {speed_source}, longer than watchdog.eval_timeout_seconds = "
            f"{w.eval_timeout_seconds:g}: every evaluation would look like a hang. Set eval_timeout_seconds to at "
            f"least {2 * eval_seconds:.0f} or lower eval_iters"
        )
    return problems
