"""`checkpoint.dir` honoured by both sides: a real `python -m trainer` run with an ABSOLUTE
checkpoint directory (BLOOM kept its checkpoints on a scratch filesystem), then the trainer's
files, the controller's view (Controller.ckpt_dir) and the dashboard must all name the same
place, and nothing may land in the run directory's default checkpoints/."""

from __future__ import annotations

from pathlib import Path

from orchestrator.contract import MANIFEST_NAME
from orchestrator.contract.checkpoints import list_checkpoints
from orchestrator.controller import Controller
from orchestrator.plan.config import load_config
from orchestrator.slurm.mock import MockScheduler
from orchestrator.views.dashboard import dashboard_data
from tests.trainer import launch_local
from tests.trainer.runs import make_run_dir


def test_absolute_checkpoint_dir_is_where_trainer_controller_and_dashboard_look(tmp_path):
    scratch = tmp_path / "scratch" / "ckpts"  # outside the run directory, absolute
    run_dir = make_run_dir(tmp_path / "run", checkpoint={"dir": str(scratch), "interval_steps": 2})
    procs = launch_local.start(run_dir, nranks=1, env={"TRAINER_MAX_STEPS": "3"})
    assert launch_local.wait(procs, timeout=240) == [0], (run_dir / "logs" / "rank-0.log").read_text()[-3000:]

    # The trainer: every checkpoint (and `latest`) in the configured directory, none in the default.
    saved = sorted(p.parent.name for p in scratch.glob("step_*/" + MANIFEST_NAME))
    assert saved == ["step_0000002", "step_0000003"], saved
    assert (scratch / "latest").read_text().strip() == "step_0000003"
    default = run_dir / "checkpoints"
    assert not default.exists() or not any(default.iterdir()), sorted(default.iterdir())

    # The controller: restart, crash-loop accounting and the disk check look here.
    cfg = load_config(run_dir / "run.yaml")
    controller_dir = Controller(run_dir, cfg, MockScheduler(tmp_path / "mock-slurm", execute=False)).ckpt_dir
    assert Path(controller_dir) == scratch
    assert [c.step for c in list_checkpoints(controller_dir) if c.complete] == [2, 3]

    # The dashboard (`runctl status`/`watch`).
    shown = dashboard_data(run_dir).checkpoint
    assert Path(shown.dir) == scratch and shown.last_step == 3, shown
