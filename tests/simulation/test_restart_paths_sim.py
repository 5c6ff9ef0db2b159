"""One simulated day of BLOOM at 20x Llama 3's failure rate (a job MTBF of 6.6 h against the
plan's 120 h), with the shipped config (local and peer copies, adaptive_interval: apply): the
relaunches on spares start from the warm standby and load the local copy, the controller leaves
the planner's MTBF once the failures say so, and the trainer saves at the applied interval."""

from __future__ import annotations

import statistics

from orchestrator.contract import RunPaths
from orchestrator.contract.interval import read_interval_directive
from orchestrator.plan.goodput_model import young_daly_interval_hours
from orchestrator.plan.planner import plan_run
from simulation import bloom_config
from simulation.soak import run_soak


def test_a_day_at_twenty_times_the_rate(sim_run_dir):
    result = run_soak(sim_run_dir, days=1.0, seed=3, rate_x=20.0, prior_rate_x=1.0)
    print("launches", result["launches"])
    print("fits", [(f["t"], f["hours"], f["failures_seen"], f["why"]) for f in result["interval_fits"]])
    assert result["missed_faults"] == 0 and result["false_positives"] == 0 and not result["false_exclusions"]

    # Restart paths: launch 0 cold; a relaunch after a launch that trained starts warm, and resumes
    # from the local copy when this job saved the checkpoint.
    launches = result["launches"]
    assert not launches[0]["standby"]
    relaunches = [x for x in launches[1:] if x["job_id"] == launches[0]["job_id"]]
    assert len(relaunches) >= 3 and all(x["standby"] for x in relaunches)
    assert {x["load_source"] for x in relaunches if x["load_source"]} == {"memory"}
    gpu = [f["first_step_after_seconds"] for f in result["faults_injected"] if f["kind"] == "gpu"]
    print("gpu fault -> first step", gpu)
    assert gpu and max(gpu) < 130

    # The interval: first the plan's Young/Daly (no failure yet), then the posterior's.
    fits = result["interval_fits"]
    assert fits[0]["why"] == "prior" and fits[0]["was_hours"] == 3.0
    stall = plan_run(bloom_config()).save_stall_seconds  # the learner's prior stall: the planner's
    assert abs(fits[0]["hours"] - young_daly_interval_hours(stall, fits[0]["plan_mtbf_hours"])) < 0.05
    last = fits[-1]
    assert last["failures_seen"] >= 3 and last["why"].startswith("P(failure rate above")
    assert last["hours"] < 0.6 * fits[0]["hours"]
    directive = read_interval_directive(RunPaths.of(sim_run_dir))
    assert directive is not None and abs(directive.interval_hours - last["hours"]) < 1e-3
    # The trainer took it at its next save: saves from then on are an interval (+ a step) apart.
    applied = last["hours"] * 3600
    later = [t for t in result["save_starts"] if t > last["t"]]
    gaps = [b - a for a, b in zip(later[1:], later[2:], strict=False)]
    print(f"applied {applied:.0f} s; gaps between saves after it: median {statistics.median(gaps):.0f} s")
    assert applied <= statistics.median(gaps) <= applied + 400
