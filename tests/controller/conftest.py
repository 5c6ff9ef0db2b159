"""Fixtures for controller tests: a run directory, a fake scheduler running fake trainer ranks,
and a controller wired to both."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import FakeScheduler, fake_submitter, make_config  # noqa: E402

from orchestrator.controller import Controller  # noqa: E402
from orchestrator.plan.config import dump_config  # noqa: E402
from orchestrator.slurm.render import run_job_name  # noqa: E402


@pytest.fixture
def run_env(tmp_path):
    """Factory: (config overrides, fake trainer env) -> (cfg, scheduler, controller)."""
    made: list[tuple[FakeScheduler, Controller]] = []

    def build(trainer_env: dict | None = None, stack_wait: float = 1.0, **overrides):
        cfg = make_config(**overrides)
        run_dir = tmp_path / "run"
        run_dir.mkdir(exist_ok=True)
        (run_dir / "run.yaml").write_text(dump_config(cfg))
        env = {"FAKE_STEPS": "20", "FAKE_STEP_SECONDS": "0.05", "FAKE_CKPT_EVERY": "5", "FAKE_BEAT": "0.1",
               "OMP_NUM_THREADS": "1", **(trainer_env or {})}
        scheduler = FakeScheduler(run_dir, cfg.world_size, env=env)
        controller = Controller(run_dir, cfg, scheduler, submitter=fake_submitter(scheduler, run_job_name(cfg.name, run_dir.resolve())),
                                stack_wait_seconds=stack_wait)
        made.append((scheduler, controller))
        return cfg, scheduler, controller

    yield build
    for scheduler, controller in made:
        scheduler.shutdown()
        controller.stop()


os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def reference_losses(local_cluster, tmp_path_factory):
    """The e2e tests' 12 steps, uninterrupted, on the 22.05 cluster: computed once for the session,
    since the 24.11 drill (test_e2e_slurm_2411.py) must reach the same losses too."""
    from test_e2e_slurm import reference_run

    return reference_run(local_cluster, tmp_path_factory)
