"""The owner's real controller (orchestrator.controller.Controller, as `runctl watch` builds it) on
the mocked SLURM, run as the owner in a forked child under umask 002, with the attack played
between its start and its passes.

    job_id = submit_as_owner(team, paths, scenario)   # the run's job, RUNNING for the test
    controller = owner_controller(team, paths)        # (a fixture) started: check_trust passed
    ... the attack, as other users ...
    controller.tick()                                 # one supervision pass (repeatable)
    results, events = controller.stop()               # every pass's PassResult, every event

The child and the parent signal each other through files in the team folder (the run's parent).
A child the test did not stop is killed at teardown: it holds the run's lock and pytest's output.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apprise.apprise
import pytest
from attack_env import Child, as_user, start_as

import orchestrator.contract.disk_space  # noqa: F401 - everything a pass imports, before any fork
import orchestrator.controller.notify  # noqa: F401
import orchestrator.plan.config.notify_urls
import orchestrator.plan.planner  # noqa: F401
import orchestrator.slurm.render  # noqa: F401
from orchestrator.cli.watch_cmd import make_controller
from orchestrator.contract import RunPaths, exclude, read_jsonl
from orchestrator.operate.runs import load_run_config, submit_job
from orchestrator.slurm.mock import MockScheduler

RUNNING = [{"state": "RUNNING", "polls": 100_000}]
# apprise finds its plugins when first used: load them now, as root (the children cannot read the
# interpreter's standard library, attack_env.py).
assert orchestrator.plan.config.notify_urls.apprise_knows("json://127.0.0.1/hook")


def mock_env(paths: RunPaths) -> dict[str, str]:
    return {"RUNCTL_SCHEDULER": "mock", "RUNCTL_MOCK_SLURM_DIR": str(paths.root.parent / "mock-slurm")}


def submit_as_owner(team, paths: RunPaths, scenario: list[dict[str, Any]] = RUNNING, folder: bool = True) -> str:
    """One job of the run through orchestrator.operate.runs.submit_job (what `runctl submit` and the
    controller's submitter call), as the owner under umask 002; returns its id. folder=False: as an
    older runctl left it, whose job folder appears only when the job starts."""

    def submit() -> str:
        scheduler = MockScheduler(paths.root.parent / "mock-slurm")
        scheduler.slurm.push_scenario(scenario)
        job_id = submit_job(paths.root, load_run_config(paths.root), scheduler)
        if not folder:
            shutil.rmtree(paths.job_dir(job_id))
        return job_id

    job_id, out = as_user(team.owner, submit, umask=0o002)
    assert isinstance(job_id, str), out
    return job_id


def wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def touch(path: Path) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


class OwnerController:
    def __init__(self, child: Child, paths: RunPaths, flags: Path):
        self.child, self.paths, self.flags = child, paths, flags
        self.passes = 0

    @classmethod
    def start(cls, team, paths: RunPaths, lock_timeout: float | None = None) -> OwnerController:
        """The controller, started (the run's lock, check_trust) and waiting for its first pass.
        lock_timeout: how long the exclude list's lock is waited for (instead of 30 s)."""
        flags = paths.root.parent / f"flags-{time.monotonic_ns()}"
        as_user(team.owner, lambda: flags.mkdir())

        def run() -> list[Any]:
            # apprise sends through one shared thread pool: one made before the fork (an earlier
            # test's notification) has no worker threads in this child.
            apprise.apprise._shared_executor = None
            if lock_timeout is not None:
                exclude.LOCK_TIMEOUT_SECONDS = lock_timeout
            controller = make_controller(paths.root)
            controller.start()
            touch(flags / "started")
            results = []
            while True:
                go, stop = flags / f"go-{len(results)}", flags / "stop"
                deadline = time.monotonic() + 60
                while not go.exists() and not stop.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                if not go.exists():
                    break
                results.append(controller.safe_tick())
                touch(flags / f"done-{len(results) - 1}")
            controller.stop()
            return results

        child = start_as(team.owner, run, umask=0o002, env=mock_env(paths))
        started, deadline = flags / "started", time.monotonic() + 30
        while not started.exists():
            if time.monotonic() > deadline:
                result, out = child.result(1)
                raise AssertionError(f"the controller did not start: {result!r}\n{out}")
            time.sleep(0.02)
        return cls(child, paths, flags)

    def tick(self, timeout: float = 20.0) -> None:
        """One pass; returns once it is done (a pass blocked on a planted file fails the test)."""
        touch(self.flags / f"go-{self.passes}")
        done, deadline = self.flags / f"done-{self.passes}", time.monotonic() + timeout
        while not done.exists():
            if time.monotonic() > deadline:
                result, out = self.child.result(1)  # ended with an error, or killed as blocked
                raise AssertionError(f"pass {self.passes} did not end within {timeout} s: {result!r}\n{out}")
            time.sleep(0.02)
        self.passes += 1

    def stop(self, timeout: float = 30.0) -> tuple[list[Any], list[dict[str, Any]]]:
        """(each pass's PassResult, every event of the run)."""
        touch(self.flags / "stop")
        result, out = self.child.result(timeout)
        assert not isinstance(result, BaseException), out
        return result, read_jsonl(self.paths.events)

    def kill(self) -> None:
        self.child.kill()


@pytest.fixture
def owner_controller() -> Iterator:
    """OwnerController.start; every child killed at teardown whatever the test did."""
    started: list[OwnerController] = []

    def start(*args: Any, **kwargs: Any) -> OwnerController:
        controller = OwnerController.start(*args, **kwargs)
        started.append(controller)
        return controller

    yield start
    for controller in started:
        controller.kill()
