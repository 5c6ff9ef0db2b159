"""The checkpoint interval that learns (orchestrator/controller/interval.py) and the directive that
carries it to the trainer (orchestrator/contract/interval.py, trainer/control.py)."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from types import SimpleNamespace

import pytest

from orchestrator.contract import Phase, RunPaths
from orchestrator.contract.client.stop import Controls
from orchestrator.contract.directive import DirectiveError
from orchestrator.contract.interval import (
    CheckpointIntervalFit,
    IntervalDirective,
    interval_directive_path,
    read_interval_directive,
    write_interval_directive,
)
from orchestrator.controller.actions import Record
from orchestrator.controller.interval import IntervalLearner, PublishInterval, fit_interval
from orchestrator.plan.goodput_model import young_daly_interval_hours

PRIOR_MTBF = 119.79  # BLOOM's plan: 46,000 GPU-hours / 384 GPUs
STALL = 30.0
BOUNDS = (0.25, 12.0)


def _month(rate_x: float, seed: int, hours: float = 720.0, every: float = 4.0) -> list[tuple[float, float]]:
    """(hour, fitted interval) every `every` hours of a month of Poisson failures at rate_x x the prior's."""
    rng, t, times = random.Random(seed), 0.0, []
    while (t := t + rng.expovariate(rate_x / PRIOR_MTBF)) < hours:
        times.append(t)
    out, left, hour = [], False, 0.0
    while hour <= hours:
        failures = sum(1 for x in times if x <= hour)
        fit = fit_interval(prior_job_mtbf_hours=PRIOR_MTBF, failures=failures, exposure_hours=hour,
                           stall_seconds=STALL, min_hours=BOUNDS[0], max_hours=BOUNDS[1], left_prior=left)  # fmt: skip
        left = fit.left_prior
        out.append((hour, fit.interval_hours))
        hour += every
    return out


def test_months_at_the_prior_rate_keep_the_interval() -> None:
    planned = young_daly_interval_hours(STALL, PRIOR_MTBF)
    moves = [max(abs(i / planned - 1) for _, i in _month(1.0, seed)) for seed in range(200)]
    calm = sum(m <= 0.2 for m in moves) / len(moves)
    print(f"months at the prior's rate that never moved the interval by more than 20%: {calm:.1%}")
    assert calm >= 0.92


def test_a_month_at_four_times_the_rate_converges_within_a_week() -> None:
    target = young_daly_interval_hours(STALL, PRIOR_MTBF / 4)
    first, end = [], []
    for seed in range(200):
        month = _month(4.0, seed)
        first.append(next((h for h, i in month if abs(i / target - 1) <= 0.25), 1e9))
        end.append(abs(month[-1][1] / target - 1))
    median = statistics.median(first)
    settled = sum(e <= 0.3 for e in end) / len(end)
    print(f"4x the prior: within 25% of Young/Daly ({target:.2f} h) after a median {median:.0f} h; "
          f"{settled:.0%} of months within 30% at their end")  # fmt: skip
    assert median <= 168
    assert settled >= 0.9  # ~24 failures a month: the fit's own Poisson noise is about 10%


def _learner(tmp_path, mode: str) -> IntervalLearner:
    paths = RunPaths.of(tmp_path)
    paths.root.mkdir(exist_ok=True)
    return IntervalLearner(paths, mode, PRIOR_MTBF, STALL, BOUNDS, in_force_hours=3.0)


def _jobs(hours: float) -> list:
    return [SimpleNamespace(started_at=0.0, ended_at=hours * 3600)]


def test_learner_records_and_applies_only_what_moves_the_interval(tmp_path) -> None:
    learner = _learner(tmp_path, "apply")
    beat = SimpleNamespace(rank=0, job_id="7", launch=0, phase=Phase.STEP, durations={"checkpoint": 31.0})
    exiting = SimpleNamespace(rank=0, job_id="6", launch=0, phase=Phase.CHECKPOINT, durations={"checkpoint": 300.0})
    first = learner.after_pass(_jobs(0.5), [exiting], now=1800.0)
    assert learner.stall_seconds() == STALL, "a job's final save (no step after it) is not a stall"
    # No failure yet: the prior's rate and stall; 3 h -> Young/Daly 1.41 h.
    assert [type(a) for a in first] == [Record, PublishInterval]
    event, directive = first[0].event, first[1].directive
    assert isinstance(event, CheckpointIntervalFit) and event.evidence == "prior"
    assert directive.interval_hours == pytest.approx(young_daly_interval_hours(STALL, PRIOR_MTBF))
    assert learner.after_pass(_jobs(1.0), [beat], now=3600.0) == [], "a 31 s stall moves it 1.6%: nothing to say"
    assert learner.stall_seconds() == 31.0
    for _ in range(12):  # 12 failures in 48 h: far above the prior's rate
        learner.note_failure()
    moved = learner.after_pass(_jobs(48.0), [beat], now=48 * 3600.0)
    fit = moved[0].event
    print(fit)
    assert fit.failures == 12 and fit.posterior_job_mtbf_hours == pytest.approx((PRIOR_MTBF + 48) / 13, abs=0.01)
    assert moved[1].directive.interval_hours == pytest.approx(
        young_daly_interval_hours(31.0, (PRIOR_MTBF + 48) / 13)
    )
    assert fit.evidence.startswith("P(failure rate above")
    suggest = _learner(tmp_path, "suggest").after_pass(_jobs(1.0), [beat], now=3600.0)
    assert [type(a) for a in suggest] == [Record]
    assert _learner(tmp_path, "off").after_pass(_jobs(1.0), [beat], now=3600.0) == []


def test_the_fit_stays_inside_the_bounds() -> None:
    fit = fit_interval(prior_job_mtbf_hours=PRIOR_MTBF, failures=500, exposure_hours=10.0, stall_seconds=STALL,
                       min_hours=0.5, max_hours=2.0)  # fmt: skip
    assert fit.young_daly_hours < 0.5 and fit.interval_hours == 0.5


# -- the directive: written by the owner's controller, hostile input to everyone else ---------------
def _controls(paths: RunPaths, rank: int = 0) -> Controls:
    return Controls(paths, rank, time.time(), None, 3.0, None, interval_bounds=(0.5, 6.0))


def test_the_trainer_takes_an_applied_interval_at_its_next_save(tmp_path) -> None:
    paths = RunPaths.of(tmp_path)
    controls = _controls(paths)
    assert controls.checkpoint_interval_hours == 3.0
    write_interval_directive(paths, IntervalDirective(1.25, time.time(), "test"))
    assert controls.checkpoint_interval_hours == 3.0, "not before the next save"
    controls.checkpoint_saved()
    assert controls.checkpoint_interval_hours == 1.25
    write_interval_directive(paths, IntervalDirective(0.01, time.time(), "below the config's minimum"))
    controls.checkpoint_saved()
    assert controls.checkpoint_interval_hours == 0.5
    assert _controls(paths, rank=1).checkpoint_interval_hours == 3.0, "only rank 0's clock decides a save"
    assert Controls(paths, 0, time.time(), None, 3.0, None).checkpoint_interval_hours == 3.0, "adaptive off"
    assert _controls(paths).checkpoint_interval_hours == 0.5, "a new launch starts with the applied one"


@pytest.mark.parametrize(
    "body, words",
    [
        ({"version": 1, "interval_hours": -1.0, "decided_at": 0.0, "reason": "x"}, "positive finite"),
        ({"version": 1, "interval_hours": "1", "decided_at": 0.0, "reason": "x"}, "interval_hours"),
        ({"version": 1, "interval_hours": 1.0, "decided_at": 0.0, "reason": "x", "skip": 1}, "unknown field"),
        ({"version": 9, "interval_hours": 1.0, "decided_at": 0.0, "reason": "x"}, "newer"),
        ({"version": 1, "interval_hours": 1.0, "decided_at": 0.0, "reason": "a\nb"}, "one line"),
    ],
)
def test_a_malformed_directive_is_refused_and_the_interval_kept(tmp_path, body, words, capsys) -> None:
    paths = RunPaths.of(tmp_path)
    paths.accepted.mkdir()
    interval_directive_path(paths).write_text(json.dumps(body))
    with pytest.raises(DirectiveError, match=words):
        read_interval_directive(paths)
    controls = _controls(paths)
    controls.checkpoint_saved()
    assert controls.checkpoint_interval_hours == 3.0
    assert "ignoring the checkpoint-interval directive" in capsys.readouterr().err


def test_a_directive_through_a_symlink_or_by_another_user_is_refused(tmp_path) -> None:
    paths = RunPaths.of(tmp_path)
    paths.accepted.mkdir()
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps(IntervalDirective(0.3, 0.0, "planted").to_dict()))
    os.symlink(elsewhere, interval_directive_path(paths))
    with pytest.raises(DirectiveError, match="only the run owner's processes"):
        read_interval_directive(paths)
    os.unlink(interval_directive_path(paths))
    write_interval_directive(paths, IntervalDirective(0.3, 0.0, "someone else's"))
    with pytest.raises(DirectiveError, match="only the run owner's processes"):
        read_interval_directive(paths, owner_uid=os.getuid() + 1)  # as the owner's trainer sees another's file
