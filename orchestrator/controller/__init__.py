"""The controller of one run, in three parts per pass (supervisor.py runs them):
- observe: observer.py (the scheduler's answer, the launcher's records, the ranks' beats judged by
  change on the controller's monotonic clock: liveness.py, detection.py, timeouts.py),
  requests.py (authenticated intake of control/), checkpoints.py, disk.py;
- decide, pure, returning actions.py values: jobs.py, kill_resume.py, launches.py, policy.py,
  recovery.py, stragglers.py, upkeep.py;
- apply: applier.py, the one place that changes the world (with reporter.py for events and
  notifications, submission.py for sbatch without duplicates, exclude.py, stacks.py).
memory.py holds what it remembers between passes, persistence.py what it writes of itself. The
records it reads and writes are the contract's (orchestrator.contract)."""

from .detection import Assessment, Finding, FindingKind, assess
from .liveness import Liveness
from .supervisor import Controller, PassResult
from .timeouts import PhaseTimeouts

__all__ = [
    "Assessment",
    "Controller",
    "Finding",
    "FindingKind",
    "Liveness",
    "PassResult",
    "PhaseTimeouts",
    "assess",
]
