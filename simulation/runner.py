"""The one runner of the named scenarios (scenarios.py): inject, pass until the bound plus the
watch period, then judge what the controller did against the scenario's policy.

Judging reads only what the controller wrote (events.jsonl, the exclude list, state.json's
status) and what the simulated world knows (when the fault happened, which node, which
checkpoint the next incarnation loaded); times are the virtual times of the passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.contract import events as ev
from orchestrator.contract import failure_events as fev
from orchestrator.contract.state import RunStatus

from .harness import Harness, bloom_config
from .scenarios import ACTIONS, DETECTIONS, STACK_WAIT, Scenario

HORIZON = 36 * 3600.0  # nothing in a scenario takes longer than this


def run_scenario(scenario: Scenario, run_dir: Path, seed: int = 0) -> tuple[list[str], dict[str, Any]]:
    run_dir = Path(run_dir)
    mounted = scenario.small_filesystem and _mount_small_tmpfs(run_dir)
    try:
        cfg = bloom_config(**scenario.config) if scenario.config else None
        with Harness(run_dir, seed=seed, cfg=cfg, spare_nodes=scenario.pool_spares) as h:
            h.small_filesystem = mounted
            facts: dict[str, Any] = {}
            scenario.inject(h, facts)
            h.run_until(HORIZON, stop=lambda hh: _watched_enough(scenario, hh, facts))
            problems = judge(scenario, h, facts)
            return problems, {**report(scenario, h, facts, problems), "small_tmpfs_mounted": mounted}
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False, capture_output=True)


def run_named(name: str, seed: int = 0) -> tuple[list[str], dict[str, Any]]:
    """run_scenario for the catalogue's scenario `name`, in a run directory of its own (on tmpfs
    where there is one: a pass rewrites the node files), removed afterwards. A plain function of
    a name, so that worker processes can run scenarios side by side (tests/simulation)."""
    from .catalogue import SCENARIOS  # noqa: PLC0415 - the catalogue builds on this module's peers

    scenario = next((s for s in SCENARIOS if s.name == name), None)
    if scenario is None:
        raise KeyError(f"no scenario {name!r}: the catalogue has {', '.join(s.name for s in SCENARIOS)}")
    with scratch_run_dir() as run_dir:
        return run_scenario(scenario, run_dir, seed)


@contextlib.contextmanager
def scratch_run_dir() -> Iterator[Path]:
    """A fresh run directory, on tmpfs where there is one (a pass rewrites up to 384 heartbeat
    files: on ext4 each rename over a file flushes its data, ~1.5 ms apiece), removed afterwards."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    holder = Path(tempfile.mkdtemp(prefix="sim-", dir=base))
    try:
        yield holder / "run"
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def _mount_small_tmpfs(run_dir: Path) -> bool:
    """A 16 MB tmpfs to fill for real (root only); False: the harness injects ENOSPC instead."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(run_dir)], capture_output=True
        )
    except OSError:
        return False
    return done.returncode == 0


def _watched_enough(scenario: Scenario, h: Harness, facts: dict[str, Any]) -> bool:
    if scenario.expect == "crash_loop" and h.controller.state.status == "crash_loop":
        return True
    if "t" not in facts:
        return False
    return h.t >= facts["t"] + facts.get("bound", 0.0) + scenario.watch_after


def judge(s: Scenario, h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = [
        f"a controller pass raised at t={t:.0f} s (the loop retries it): {err}" for t, err in h.crashes
    ]
    t0 = facts.get("t")
    if t0 is None:
        return [*problems, "the fault never fired (the run did not get that far)"]
    after = [e for e in h.events if e[1] >= t0]
    names = [(round(e[0] - t0), e[2].KIND) for e in after]
    detections = [e for e in after if e[2].KIND in DETECTIONS]
    poll = h.cfg.watchdog.poll_seconds
    if s.expect == "restart":
        if not detections:
            problems.append(
                f"not detected in {h.t - t0:.0f} s (bound {facts['bound']:.0f} s); events: {names[:8]}"
            )
        else:
            took = detections[0][0] - t0
            if took > facts["bound"]:
                problems.append(
                    f"detected {took:.0f} s after the fault, bound {facts['bound']:.0f} s ({s.bound})"
                )
            if s.within is not None and took > s.within:
                problems.append(f"detected {took:.0f} s after the fault, the target is {s.within:.0f} s")
            restarts = [e for e in after if isinstance(e[2], fev.Restart)]
            if not restarts:
                problems.append("detected but never restarted")
            elif restarts[0][1] - detections[0][0] > STACK_WAIT + 2 * poll:
                problems.append(
                    f"restart submitted {restarts[0][1] - detections[0][0]:.0f} s after detection "
                    f"(bound {STACK_WAIT + 2 * poll:.0f} s); login node hashed {h.hashed_bytes / 1e12:.2f} TB"
                )
        submitted = [j for j in h.own_jobs() if j.submit_time >= t0]
        if len(submitted) > 1:
            problems.append(
                f"{len(submitted)} jobs submitted for one incident: {[j.job_id for j in submitted]}"
            )
    elif s.expect == "nothing":
        acted = [n for n in names if n[1] in ACTIONS]
        if acted:
            problems.append(f"acted on something that is not a failure: {acted[:6]}")
        clear = facts.get("clear", t0)
        if not any(end > clear for _, _, _, end in h.world.steps):
            problems.append("training did not go on after the event")
    elif s.expect == "killed":
        if h.controller.state.status != RunStatus.KILLED:
            problems.append(f"status {h.controller.state.status!r}, expected 'killed'")
        if detections or any(n[1] == "restart" for n in names):
            problems.append(f"treated the kill as a failure: {names[:8]}")
        if not any(inc.exit_code == 17 for inc in h.world.incarnations):
            problems.append("the trainer never exited 17 (saved and stopped)")
    elif s.expect == "crash_loop":
        limit = h.cfg.watchdog.max_restarts_without_progress
        if h.controller.state.status != RunStatus.CRASH_LOOP:
            problems.append(
                f"status {h.controller.state.status!r} after {len(h.own_jobs())} jobs, expected 'crash_loop'"
            )
        launches = len(h.world.incarnations)  # in a job with spares, restarts are relaunches inside it
        if launches != limit + 1:
            problems.append(
                f"{launches} launches ran ({len(h.own_jobs())} jobs), expected {limit + 1} "
                "(1 + max_restarts_without_progress)"
            )
    elif s.expect == "custom":
        problems += s.check(h, facts)
    elif s.expect == "survive":
        told = [
            e
            for e in after
            if isinstance(e[2], ev.Disk)
            and e[2].level in ("warning", "critical")
            or "No space" in json.dumps(e[2].to_dict())
            or "ENOSPC" in json.dumps(e[2].to_dict())
        ]
        if not told:
            problems.append(f"nobody was told about the full disk; events after it: {names[:8]}")
    if s.check is not None and s.expect != "custom":  # what the scenario judges besides
        problems += s.check(h, facts)
    problems += _judge_exclusions(s, h, facts)
    if "corrupt" in facts:
        problems += _judge_corrupt(h, facts)
    return problems


def _judge_exclusions(s: Scenario, h: Harness, facts: dict[str, Any]) -> list[str]:
    excluded, culprit = set(h.excluded()), facts.get("culprit")
    allowed = {culprit} - {None}
    if s.exclude == "culprit" and excluded != allowed:
        return [
            f"excluded {sorted(excluded)[:6]} ({len(excluded)} nodes), expected exactly {sorted(allowed)}"
        ]
    if s.exclude == "none" and excluded:
        return [f"excluded {sorted(excluded)[:6]} ({len(excluded)} nodes), expected none"]
    if s.exclude == "slurm":
        left = [e[2] for e in h.events if e[2].KIND == "node_left_to_slurm"]
        if excluded or culprit not in {e.node for e in left}:
            return [
                f"excluded {sorted(excluded)[:6]}; left to SLURM {[e.node for e in left]}: expected "
                f"nothing excluded and {culprit} left to SLURM (it had declared it DOWN)"
            ]
        return []
    if s.exclude == "at_most_culprit" and not excluded <= allowed:
        return [f"excluded {sorted(excluded)[:6]} ({len(excluded)} nodes), at most {sorted(allowed)} allowed"]
    return []


def _judge_corrupt(h: Harness, facts: dict[str, Any]) -> list[str]:
    problems = []
    if not (h.world.ckpt_dir / facts["corrupt"]).is_dir():
        problems.append(f"the damaged {facts['corrupt']} was deleted (keep it for inspection)")
    later = [i for i in h.world.incarnations if i.started > facts["t"] and i.resume_step is not None]
    if not later:
        problems.append("no job resumed after the restart within the watch period")
    elif later[0].resume_step != facts["previous"]:
        problems.append(
            f"resumed from step {later[0].resume_step}, expected {facts['previous']} (the previous one)"
        )
    step = str(int(facts["corrupt"].split("_")[1]))
    if not any(
        facts["corrupt"] in json.dumps(e[2].to_dict())
        or (isinstance(e[2], (ev.CheckpointCorrupt, ev.CheckpointComplete)) and str(e[2].step) == step)
        for e in h.events
    ):
        problems.append(f"the controller did not report the damaged {facts['corrupt']}")
    return problems


def report(s: Scenario, h: Harness, facts: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    t0 = facts.get("t")
    detections = [e for e in h.events if t0 is not None and e[1] >= t0 and e[2].KIND in DETECTIONS]
    return {
        "scenario": s.name,
        "given": s.given,
        "fault": s.fault,
        "bound": s.bound,
        "bound_seconds": facts.get("bound"),
        "expect": s.expect,
        "exclude": s.exclude,
        "detected_after_seconds": round(detections[0][0] - t0, 1) if detections else None,
        "excluded": h.excluded()[:8],
        "excluded_count": len(h.excluded()),
        "status": h.controller.state.status,
        "controller_crashes": [err for _, err in h.crashes],
        "passes": len(h.passes),
        "simulated_hours": round(h.t / 3600, 2),
        "login_node_hashed_tb": round(h.hashed_bytes / 1e12, 3),
        "problems": problems,
    }
