"""The controller: supervision (detection.py, pure), learned timeouts (timeouts.py), the pass
that acts on findings (supervisor.py), state.json/events.jsonl (state.py), the run lock
(lock.py), the exclude list (exclude.py), checkpoints seen from the login node (checkpoints.py),
the disk check (disk.py) and submission without duplicates (submission.py)."""

from .detection import Assessment, Finding, FindingKind, Outcome, assess, classify_end, read_heartbeats
from .state import ControllerState, RunStatus, load_state, read_events
from .supervisor import Controller, PassResult
from .timeouts import PhaseTimeouts

__all__ = [
    "Assessment",
    "Controller",
    "ControllerState",
    "Finding",
    "FindingKind",
    "Outcome",
    "PassResult",
    "PhaseTimeouts",
    "RunStatus",
    "assess",
    "classify_end",
    "load_state",
    "read_events",
    "read_heartbeats",
]
