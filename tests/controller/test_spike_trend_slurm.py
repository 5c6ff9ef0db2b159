"""A loss spike of +10% on a falling curve, caused by data, found against the curve's trend and rolled
back, on the real local SLURM cluster (the real controller, `python -m trainer`, one rank).

The demo's model (configs/demo-cpu-4node.yaml) at tp = pp = 1, global batch 8, 70 steps, a
checkpoint every 10 steps. Two runs:
- clean: the shipped corpus, policy notify; no finding at all;
- poisoned: a copy of the corpus in which the tokens of the samples of steps 34-37 (positions
  264-295 of the sample order) are random ids, lengths unchanged (tests/poisoned_corpus.py): the
  loss of those steps is ~10% above the curve's trend, which still falls ~0.03 a step there.
  Policy rollback, a 20-step window, 2 steps in a row, margin 2 steps, skip margin 5 batches.
Expected by hand: found at onset 34, met at 35; back to step 30 (the newest checkpoint at or before
34 - 1 - 2), skipping [30 x 8, 34 x 8 + 5 x 8) = [240, 312); the final sample order 0..239 then
312..631 (steps 31-70 read 312 + 40 x 8); the last 10 steps' mean loss within 0.1 of the clean run's.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from fakes import REPO
from rollback_runs import drive, final_order, job_outputs, of_kind

from orchestrator.contract import RunPaths, read_jsonl
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import parse_config
from orchestrator.plan.config.load import resolve_paths
from tests.poisoned_corpus import poison_corpus
from tests.trainer.runs import CORPUS_PREFIX, ensure_corpus, tiny_config_dict

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS, GBS = 70, 8
POISONED = range(33 * GBS, 37 * GBS)  # the samples of steps 34-37
EXPECTED_ORDER = [*range(0, 240), *range(312, 632)]


def demo_config(corpus: Path, policy: str):
    ensure_corpus()
    demo = yaml.safe_load((REPO / "configs" / "demo-cpu-4node.yaml").read_text())
    data = tiny_config_dict(
        model=demo["model"],
        parallel={"tp": 1, "pp": 1, "micro_batch_size": 2, "global_batch_size": GBS},
        optimizer=demo["optimizer"],
        cluster={"nodes": 1, "gpus_per_node": 1, "python": sys.executable, "cpus_per_task": 1,
                 "env": {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}},
        data={"datasets": [{"path": str(corpus), "weight": 1.0}], "train_samples": 800, "eval_iters": 0,
              "eval_interval": 1000},
        checkpoint={"interval_steps": 10, "keep_last": 20},
        watchdog={"heartbeat_seconds": 0.5, "poll_seconds": 0.5, "dead_after_seconds": 8, "step_timeout_seconds": 20},
        operators={"group": None, "users": []},
        notifications={},
        health={"spike_window": 20, "spike_consecutive": 2, "rollback_margin_steps": 2,
                "rollback_skip_margin_batches": 5, "policy": {"loss_spike": policy}},
    )
    return resolve_paths(parse_config(data, source="tests"), REPO / "configs")


def run_to_the_end(cfg, run: Path, env: dict) -> RunPaths:
    from orchestrator.operate.runs import prepare_run_dir, submit_job
    from orchestrator.slurm.real import SlurmScheduler

    prepare_run_dir(cfg, run)
    scheduler = SlurmScheduler(env=env)
    submit_job(run, cfg, scheduler, reason="initial")
    ctl = Controller(run, cfg, scheduler)
    ctl.start()
    try:
        status = drive(ctl, 360)
        assert status == RunStatus.FINISHED, f"{status}\n{job_outputs(ctl.paths)}"
    finally:
        live = [j.job_id for j in ctl.state.live_jobs()]
        if live:
            ctl.scheduler.cancel(live)
        ctl.stop()
    return ctl.paths


def kept_losses(paths: RunPaths) -> dict[int, float]:
    history: dict[int, float] = {}
    for record in read_jsonl(paths.metrics):
        history[record["step"]] = record["loss"]  # the last record of a step is the kept history's
    return history


@pytest.fixture(scope="module")
def runs(local_cluster):
    root = Path(tempfile.mkdtemp(prefix="rc-spike-", dir="/tmp"))
    env = {**local_cluster.slurm_env(), "TRAINER_MAX_STEPS": str(STEPS), "TRAINER_TENSORBOARD": "0",
           "TRAINER_SAMPLE_LOG": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        began = time.monotonic()
        clean = run_to_the_end(demo_config(CORPUS_PREFIX, "notify"), root / "clean", env)
        cfg = demo_config(root / "corpus" / "poisoned", "rollback")
        poisoned = poison_corpus(CORPUS_PREFIX, root / "corpus" / "poisoned", cfg, POISONED)
        assert poisoned.tokens_replaced > 0.9 * len(POISONED) * cfg.model.seq_length
        spiked = run_to_the_end(cfg, root / "poisoned", env)
        print(f"two runs of {STEPS} steps: {time.monotonic() - began:.1f} s")
        yield clean, spiked
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_clean_demo_curve_has_no_finding(runs):
    clean, _ = runs
    assert of_kind(clean, "health_finding") == []
    losses = kept_losses(clean)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[14] - losses[33] > 0.3, "the curve must still fall where the spike comes"


def test_a_ten_percent_data_spike_is_found_against_the_trend_and_rolled_back_for_good(runs):
    clean, spiked = runs
    first_history: dict[int, float] = {}  # the steps the first job trained, before the rollback
    for record in read_jsonl(spiked.metrics):
        if first_history and record["step"] <= max(first_history):
            break
        first_history[record["step"]] = record["loss"]
    clean_losses = kept_losses(clean)
    rise = {s: round(first_history[s] / clean_losses[s] - 1, 4) for s in range(30, max(first_history) + 1)}
    print(f"poisoned / clean - 1 over the first history from step 30 (stopped after {max(first_history)}): {rise}")
    assert max(first_history) >= 35 and all(0.05 < rise[s] < 0.15 for s in range(34, min(38, max(first_history) + 1)))
    assert all(abs(rise[s]) < 0.01 for s in range(30, 34)), "the poison must change nothing before step 34"
    [finding] = of_kind(spiked, "health_finding")
    print(finding["message"])
    assert (finding["finding"], finding["onset_step"], finding["met_step"], finding["policy"]) == (
        "loss_spike", 34, 35, "rollback")
    assert finding["trend"] < clean_losses[30] and finding["trend_slope"] < 0, "judged against a falling trend"
    assert finding["spreads"] > 5 and finding["residual_spread"] > 0
    assert finding["limit"] == pytest.approx(finding["trend"] + finding["margin"], abs=1e-4)
    [plan] = of_kind(spiked, "rollback_planned")
    assert (plan["to_step"], plan["skip_samples"], plan["automatic"]) == (30, [[240, 312]], True)
    [applied] = of_kind(spiked, "rollback_applied")
    assert applied["resumed_from"] == 30, job_outputs(spiked)
    # The poisoned samples are never read again; the kept history read the sample order minus the skip.
    lines = read_jsonl(spiked.sample_log(0))
    back = next(i for i in range(1, len(lines)) if lines[i]["step"] <= lines[i - 1]["step"])
    assert not {p for line in lines[back:] for p in line["positions"]} & set(POISONED)
    assert final_order(spiked) == EXPECTED_ORDER
    losses = kept_losses(spiked)
    assert sorted(losses) == list(range(1, STEPS + 1))
    tail = [s for s in range(STEPS - 9, STEPS + 1)]
    mean_spiked = sum(losses[s] for s in tail) / 10
    mean_clean = sum(clean_losses[s] for s in tail) / 10
    print(f"mean loss of steps {tail[0]}-{tail[-1]}: rolled back {mean_spiked:.4f}, clean {mean_clean:.4f}, "
          f"difference {mean_spiked - mean_clean:+.4f}")
    assert abs(mean_spiked - mean_clean) < 0.1
