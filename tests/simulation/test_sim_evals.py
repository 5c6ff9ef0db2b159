"""The simulated trainer evaluates as trainer/loop.py does: after every data.eval_interval-th step,
before a save due at the same step, for eval_iters forward-only iterations (a BLOOM step does a
forward, a backward of twice that and the activation recompute: an eval iteration is a quarter of
it). The soak's eval share is priced by it."""

from __future__ import annotations

from orchestrator.plan.planner import plan_run
from simulation.harness import Harness, bloom_config


def test_an_eval_every_interval_and_before_a_save_at_its_step(sim_run_dir):
    # An eval every 3 steps and a save every ~6 steps: many of them fall on the same step.
    cfg = bloom_config(
        data={"eval_interval": 3}, checkpoint={"adaptive_interval": "off", "interval_hours": 0.15}
    )
    assert cfg.parallel.activation_checkpointing
    expected_seconds = cfg.data.eval_iters * plan_run(cfg).seconds_per_iteration / 4  # 5 x 104.67 s / 4
    with Harness(sim_run_dir, seed=1, cfg=cfg, cap_seconds=3600.0) as h:
        h.run_until(4 * 3600)
        notes, steps = list(h.world.notes), list(h.world.steps)
    evals = [(t, f["seconds"]) for t, what, f in notes if what == "eval_start"]
    saves = {round(t, 6): f["step"] for t, what, f in notes if what == "save_start"}
    step_ends = {round(t, 6): index for index, _, _, t in steps}
    eval_steps = [step_ends[round(t, 6)] for t, _ in evals]
    done = max(index for index, _, _, _ in steps)
    print(
        f"{len(evals)} evals of {min(s for _, s in evals):.1f}-{max(s for _, s in evals):.1f} s "
        f"(planner {expected_seconds:.1f} s) after steps {eval_steps[:8]}...; {len(saves)} saves"
    )
    assert eval_steps == list(range(3, done + 1, 3)), "an eval after every third step, none skipped"
    assert all(abs(s / expected_seconds - 1) < 0.07 for _, s in evals)  # the 2% noise, clipped at 3 sigma
    # A save due at an eval's step starts when the eval ends.
    after_eval = [saves[round(t + s, 6)] for t, s in evals if round(t + s, 6) in saves]
    assert len(after_eval) >= 3 and all(step % 3 == 0 for step in after_eval), after_eval
    assert not any(step % 3 == 0 and step not in after_eval for step in saves.values()), (
        "a save before its eval"
    )
