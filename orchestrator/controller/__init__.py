"""The controller. Deciding and acting are separate:
- observing: liveness.py (beats judged by change, on the controller's monotonic clock),
  detection.py (pure rules: dead, missing, hung; job-wide incidents), timeouts.py (learned per
  phase), checkpoints.py (the resume point, without reading bytes), disk.py;
- deciding (pure, returning actions.py values): policy.py (failures, job ends), recovery.py
  (restart, crash loop, lost work, exclusion cap), kill_resume.py (operator requests);
- acting: supervisor.py (the loop, one pass, and `apply`), requests.py (authenticated intake of
  control/), submission.py (no duplicate sbatch), exclude.py, lock.py, state.py (state.json with
  its status-transition table, events.jsonl)."""

from .detection import Assessment, Finding, FindingKind, Outcome, assess, classify_end, read_heartbeats
from .liveness import Liveness
from .state import ControllerState, RunStatus, load_state, read_events
from .supervisor import Controller, PassResult
from .timeouts import PhaseTimeouts

__all__ = [
    "Assessment",
    "Controller",
    "ControllerState",
    "Finding",
    "FindingKind",
    "Liveness",
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
