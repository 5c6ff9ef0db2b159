"""The controller of one run, in three parts per pass (supervisor.py runs them):
- observe: observer.py (the scheduler's answer, the launcher's records, the ranks' beats judged by
  change on the controller's monotonic clock: liveness.py, detection.py, timeouts.py),
  requests.py (authenticated intake of control/), the contract's checkpoint listing and disk check;
- decide, pure, returning actions.py values: jobs.py, kill_resume.py, launches.py, policy.py,
  recovery.py, stragglers.py, upkeep.py;
- apply: applier.py, the one place that changes the world (with reporter.py for events and
  notifications, submission.py for sbatch without duplicates, stacks.py; the exclude list is the contract's).
memory.py holds what it remembers between passes, persistence.py what it writes of itself. The
records it reads and writes are the contract's (orchestrator.contract), and so is every cause it
acts on and its response (contract/causes.py)."""

from .detection import Assessment, Finding, assess
from .liveness import Liveness
from .supervisor import Controller, PassResult
from .timeouts import PhaseTimeouts

__all__ = [
    "Assessment",
    "Controller",
    "Finding",
    "Liveness",
    "PassResult",
    "PhaseTimeouts",
    "assess",
]
