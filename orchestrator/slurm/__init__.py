"""SLURM layer: the Scheduler interface (`base`), real and mocked backends, sbatch rendering.

from orchestrator.slurm import get_scheduler
scheduler = get_scheduler()        # RUNCTL_SCHEDULER=slurm|mock, else slurm if sbatch is on PATH
"""

from __future__ import annotations

import os
import shutil

from orchestrator.errors import UsageError

BACKENDS = ("slurm", "mock")


def scheduler_name(name: str | None = None) -> str:
    """The backend to use: `name`, else env RUNCTL_SCHEDULER, else slurm when `sbatch` is on PATH,
    else mock."""
    chosen = (name or os.environ.get("RUNCTL_SCHEDULER") or "").strip().lower()
    if not chosen or chosen == "auto":
        return "slurm" if shutil.which("sbatch") else "mock"
    if chosen not in BACKENDS:
        raise UsageError(f"RUNCTL_SCHEDULER={chosen!r}: choose one of {', '.join(BACKENDS)} or auto")
    return chosen


def get_scheduler(name: str | None = None, **kwargs):  # -> Scheduler
    """A Scheduler instance. kwargs go to the backend: SlurmScheduler(env=, timeout=) or
    MockScheduler(directory=, execute=) (defaults: $RUNCTL_MOCK_SLURM_DIR, its config.json)."""
    if scheduler_name(name) == "slurm":
        from .real import SlurmScheduler

        return SlurmScheduler(**kwargs)
    from .mock import MockScheduler

    return MockScheduler(**kwargs)
