"""Detection latency for a crash, a frozen rank and a hang, and the time from the failure to the
first training step after the restart.

    python bench/controller_latency.py

Runs the real controller against the test suite's fake scheduler, whose jobs are real processes
(4 fake trainer ranks that follow the run-directory contract and advance in lockstep), with fast
watchdog settings (poll 0.1 s, dead after 1.5 s, step timeout 3 s). Latency = the controller's
detection time minus the failure time it reports (the crash: the moment the scheduler saw the
rank exit; frozen: the last beat; hang: the last progress). Real-cluster numbers for the same
path come from tests/controller/test_e2e_slurm.py (printed; see its docstring).
Results are merged into bench/results/controller.json.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "controller"))

from fakes import FakeScheduler, fake_submitter, make_config

from orchestrator.contract import failure_events as fev
from orchestrator.contract import read_heartbeats
from orchestrator.contract.events import read_events
from orchestrator.contract.state import RunStatus
from orchestrator.controller import Controller
from orchestrator.plan.config import dump_config

RESULTS = REPO / "bench" / "results" / "controller.json"


def scenario(kind: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"bench-lat-{kind}-") as tmp:
        cfg = make_config()
        run_dir = Path(tmp)
        (run_dir / "run.yaml").write_text(dump_config(cfg))
        env = {"FAKE_STEPS": "40", "FAKE_STEP_SECONDS": "0.05", "FAKE_CKPT_EVERY": "10", "FAKE_BEAT": "0.1",
               "OMP_NUM_THREADS": "1"}
        scheduler = FakeScheduler(run_dir, cfg.world_size, env=env)
        if kind == "hang":
            scheduler.env_for_job = [{"FAKE_HANG_AT": "15:2"}]
        ctl = Controller(run_dir, cfg, scheduler, submitter=fake_submitter(scheduler, cfg.name), stack_wait_seconds=1.0)
        ctl.start()
        injected = False
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                status = ctl.tick().status
                if status in RunStatus.STOPPED:
                    break
                job = scheduler.running()
                if not injected and kind in ("crash", "freeze") and job is not None:
                    beats = read_heartbeats(ctl.paths.heartbeats)
                    if any(b.job_id == job.job_id and b.step >= 15 for b in beats):
                        victim = job.procs[1]
                        os.kill(victim.pid, signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
                        injected = True
                time.sleep(cfg.watchdog.poll_seconds)
        finally:
            scheduler.shutdown()
            ctl.stop()
        events = read_events(ctl.paths.events)
        failure = next(e for e in events if isinstance(e, fev.Failure))
        first = next(e for e in events if isinstance(e, fev.FirstStepAfterRestart))
        return {
            "cause": failure.cause,
            "detection_latency_s": failure.detection_time - failure.failure_time,
            "failure_to_first_step_s": first.seconds_since_failure,
            "finished": status == RunStatus.FINISHED,
        }


def main() -> int:
    cfg = make_config()
    results = {}
    for kind in ("crash", "freeze", "hang"):
        runs = [scenario(kind) for _ in range(2)]
        results[kind] = {
            "cause_seen": runs[0]["cause"],
            "detection_latency_s": statistics.median(r["detection_latency_s"] for r in runs),
            "failure_to_first_step_s": statistics.median(r["failure_to_first_step_s"] for r in runs),
            "all_finished": all(r["finished"] for r in runs),
        }
        print(f"{kind:>6}: seen as {runs[0]['cause']:<10} detected after {results[kind]['detection_latency_s']:.2f} s, "
              f"training again {results[kind]['failure_to_first_step_s']:.2f} s after the failure")
    w = cfg.watchdog
    merged = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    merged["detection_latency"] = {
        "settings": {"poll_s": w.poll_seconds, "dead_after_s": w.dead_after_seconds, "step_timeout_s": w.step_timeout_seconds},
        "expected_bounds_s": {"crash": w.poll_seconds, "freeze": w.dead_after_seconds + w.poll_seconds,
                              "hang": w.step_timeout_seconds + w.poll_seconds},
        "note": "fake scheduler with real processes; failure_to_first_step includes the 1 s stack-dump wait",
        **results,
        "load_average_1min": os.getloadavg()[0],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
