"""The five checks of a chain run (chain.py), shared by the plain and the torchrun loop's tests."""

from __future__ import annotations

from orchestrator.contract import read_allocation

from .chain import FLOOR, HEARTBEAT, POLL, ROLLBACK_TO, SKIPPED, STEP_SECONDS, Chain

LATE_PASS = 2.0  # slack for a pass that runs late (the ranks and the controller on 2 cores)


def check_node_loss_relaunched_on_the_spare(chain: Chain) -> None:
    first = chain.events("failure")[0]
    assert first["cause"] == "dead_rank" and first["ranks"][0]["rank"] == 1, (first, chain.outputs())
    restart = chain.events("restart")[0]
    assert restart["in_allocation"] and restart["job_id"] == first["job_id"] and restart["resume_step"] == 2, restart
    lost = first["ranks"][0]["host"]
    allocation = read_allocation(chain.paths.allocation(first["job_id"]))
    back = chain.events("first_step_after_restart")[0]
    print(f"node loss: {lost} left out, launch 1 on {allocation.nodes}; cold relaunch: first step "
          f"{back['seconds_since_restart']:.1f} s after the decision, {back['seconds_since_failure']:.1f} s "
          "after the failure")
    assert allocation.launch >= 1 and lost in allocation.left_out and lost not in allocation.nodes


def check_sigkill_restarts_from_the_loops_own_checkpoint(chain: Chain) -> None:
    """Under srun the task was killed (a signal: its node is left out, and with no spare left the
    next job starts); under torchrun, torchrun exited 1 (its worker was killed; no node is to
    blame: a relaunch on the same nodes). Either way, from the loop's own step-4 checkpoint."""
    failure = chain.events("failure")[1]
    said = (failure.get("srun_says") or "") + (failure.get("rank_error") or "")
    assert failure["cause"] == "launch_failed" and ("Killed" in said or "ChildFailedError" in said), failure
    restart = chain.events("restart")[1]
    assert restart["resume_step"] == 4, restart
    output = (chain.paths.jobs / f"slurm-{restart['job_id']}.out").read_text(errors="replace")
    assert "start at step 4 from " in output and "step_0000004" in output, output[-2000:]
    print(f"SIGKILL: {restart['how']}")


def check_hang_in_backward_found_within_the_learned_limit(chain: Chain) -> None:
    failure = next(e for e in chain.events("failure") if e["cause"] == "hang")
    hung = next((r for r in failure["ranks"] if r["rank"] == 1), failure["ranks"][0])
    limit = hung["limit_seconds"]
    detected_after = failure["detection_time"] - chain.beats[1].progress_time
    bound = limit + HEARTBEAT + 2 * POLL
    print(f"hang of rank 1 at step {hung['step']} ({hung['phase']}), last unit {chain.beats[1].progress_unit}: "
          f"limit {limit:.2f} s (floor {FLOOR:g}, gaps {chain.beats[1].mark_gaps}); detected "
          f"{detected_after:.2f} s after its last mark (bound {bound:.2f} s)")
    assert hung["phase"] == "step" and hung["step"] == 6 and chain.beats[1].progress_unit == "forward", failure
    restart = next(e for e in chain.events("restart") if e["cause"] == "hang")
    assert restart["resume_step"] == 6, restart
    assert FLOOR < limit < 3 * (STEP_SECONDS + 1.0), "learned from the loop's own gaps, not the floor"
    assert limit <= detected_after <= bound + LATE_PASS, (detected_after, limit)


def check_rollback_skips_are_never_read_again(chain: Chain) -> None:
    [applied] = chain.events("rollback_applied")
    assert applied["resumed_from"] == ROLLBACK_TO, applied
    skipped = set(range(*SKIPPED))
    for rank in range(3):
        lines = chain.samples(rank)
        after = [line for line in lines if int(line["job"]) > int(chain.rollback_job)]
        assert after[0]["step"] == ROLLBACK_TO + 1, after[:2]
        read_after = {p for line in after for p in line["positions"]}
        assert not read_after & skipped, sorted(read_after & skipped)
    read_before = {p for r in range(3) for line in chain.samples(r) if line["job"] == chain.rollback_job
                   for p in line["positions"]}
    assert skipped <= read_before, "step 8's samples were read once, before the rollback"
    print(f"rollback {applied['directive_id']}: resumed from {applied['resumed_from']}, {sorted(skipped)} never read again")


def check_kill_by_another_operator_saves_then_stops(chain: Chain) -> None:
    assert chain.status == "killed", chain.outputs()
    ended = chain.events("job_ended")[-1]
    assert ended["exit_code"] == 17 and ended["outcome"] == "killed", ended
    asked = [e for e in chain.events("kill_requested")][-1]
    assert asked["by"] == chain.killed_by, asked
    latest = (chain.paths.checkpoints / "latest").read_text().strip()
    saved = int(latest.split("_")[1])
    assert saved >= chain.kill_asked_step, (latest, chain.kill_asked_step)
    assert not [e for e in chain.events("restart") if e["time"] > asked["time"]], "restarted after the kill"
