"""A full disk that heals.

- The pause rules (disk_pause.py) on plain data: a failure while the next checkpoint does not fit
  pauses (cancel, hold, one event, one notification, no restart, no exclusion); a fit resumes.
- What to delete, read from a real checkpoint folder.
- The controller on a real full filesystem (a small tmpfs as the checkpoint folder, fake trainer
  ranks): the save that hits ENOSPC pauses the run with the filesystem named in `runctl status`;
  once space is back the run resumes by itself and finishes with the uninterrupted losses.
- Every output of the controller survives ENOSPC (state, events, its heartbeat, the plain logger
  on stdout): the production loop (`Controller.run`) supervises the run to its end, says so on
  stderr, and writes again once the disk is back.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import pytest
from fake_trainer import loss_at
from fakes import WebhookServer, kind_of, supervise

from orchestrator.cli.main import main as runctl
from orchestrator.contract import JobState, Manifest, RunPaths, read_jsonl
from orchestrator.contract.disk_space import DiskCheck, what_to_delete
from orchestrator.contract.exclude import excluded_nodes
from orchestrator.contract.manifest import FileEntry, write_manifest
from orchestrator.contract.state import ControllerState, DiskPause, JobRecord, RunStatus
from orchestrator.controller import disk_pause
from orchestrator.controller.actions import (
    Cancel,
    Hold,
    Notify,
    Record,
    Release,
    RestartRun,
    SetStatus,
    Submit,
)
from tests.fixtures_disk import fill
from tests.run_records import event_dicts

MIB = 1 << 20


def full(free: int = 100, expected: int = 1000) -> DiskCheck:
    return DiskCheck("critical", free, expected, "size of the last checkpoint", "/ckpt", mount="/scratch")


def roomy() -> DiskCheck:
    return DiskCheck("ok", 10**9, 1000, "size of the last checkpoint", "/ckpt", mount="/scratch")


def a_state(*jobs: JobRecord) -> ControllerState:
    state = ControllerState(status=RunStatus.RUNNING)
    state.jobs = list(jobs)
    return state


# -- the rules ------------------------------------------------------------------------------------
def test_a_failure_on_a_full_disk_pauses_once_without_restart_or_blame():
    running = JobRecord("7", 0.0, state=JobState.RUNNING.value)
    queued = JobRecord("8", 0.0, state=JobState.PENDING.value)
    held_by_a_person = JobRecord("9", 0.0, state=JobState.HELD.value)
    state = a_state(running, queued, held_by_a_person)
    advice = [{"path": "/ckpt/step_0000010", "bytes": 600, "why": "unfinished save (no MANIFEST)"}]
    actions = disk_pause.pause_on_failure(
        state, job_id="7", cause="hang", job_running=True, check=full(free=100, expected=1000),
        to_delete=advice, queued=[queued, held_by_a_person], wall_now=50.0,
    )  # fmt: skip
    assert actions is not None
    assert Cancel(("7",), "failed (hang) while the checkpoint disk was full") in actions
    assert Hold(("8",)) in actions, "only the job that would start is held, not one a person held"
    assert SetStatus(RunStatus.DISK_FULL) in actions
    assert not [a for a in actions if isinstance(a, (RestartRun, Submit))]
    (notify,) = [a for a in actions if isinstance(a, Notify)]
    print(notify.message)
    assert notify.kind == "disk" and "/scratch" in notify.message and "/ckpt/step_0000010" in notify.message
    (event,) = [a.event for a in actions if isinstance(a, Record)]
    assert (event.mount, event.free_bytes, event.needed_bytes) == ("/scratch", 100, 1100)  # 1000 + 10 %

    # Applied, then a second failure while paused: cancelled and held, nothing new said.
    state.disk_pause = DiskPause("/scratch", 100, 1100, 50.0, "7", advice, ["8"])
    state.status = RunStatus.DISK_FULL
    again = disk_pause.pause_on_failure(
        state, job_id="8", cause="job_failed", job_running=False, check=full(), to_delete=advice,
        queued=[], wall_now=60.0,
    )  # fmt: skip
    assert again == []


def test_a_failure_with_room_on_the_disk_is_not_a_pause():
    state = a_state(JobRecord("7", 0.0, state=JobState.RUNNING.value))
    assert disk_pause.pause_on_failure(
        state, job_id="7", cause="job_failed", job_running=False, check=roomy(), to_delete=[],
        queued=[], wall_now=1.0,
    ) is None  # fmt: skip
    exactly_enough = DiskCheck("warning", 1100, 1000, "s", "/ckpt", mount="/scratch")
    assert exactly_enough.fits and not DiskCheck("critical", 1099, 1000, "s", "/ckpt").fits


def test_while_paused_refreshes_then_resumes_by_releasing_or_submitting():
    pause = DiskPause("/scratch", 100, 1100, 50.0, "7", [], ["8"])
    queued = JobRecord("8", 0.0, state=JobState.HELD.value)
    state = a_state(JobRecord("7", 0.0, state="failed", outcome="failed", ended_at=40.0), queued)
    state.status, state.disk_pause = RunStatus.DISK_FULL, pause
    still = disk_pause.while_paused(state, full(free=300), [], wall_now=70.0)
    assert [type(a).__name__ for a in still] == ["ChangeState"] and still[0].disk_pause.free_bytes == 300
    back = disk_pause.while_paused(state, roomy(), [], wall_now=110.0)
    assert Release(("8",)) in back and SetStatus(RunStatus.WAITING) in back
    (event,) = [a.event for a in back if isinstance(a, Record)]
    assert event.paused_seconds == 60.0 and event.mount == "/scratch"
    state.jobs = state.jobs[:1]  # nothing queued: a new job resumes the run
    assert Submit("resume after the checkpoint disk was full") in disk_pause.while_paused(state, roomy(), [], 110.0)
    state.status = RunStatus.KILLED
    assert disk_pause.while_paused(state, roomy(), [], 110.0) == [], "a stopped run is not resumed"


def test_what_to_delete_names_unfinished_saves_first_and_never_the_newest(tmp_path):
    ckpt = tmp_path / "checkpoints"
    for step in (4, 8, 12):
        folder = ckpt / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / "model.pt").write_bytes(b"x" * 1000)
        write_manifest(folder, Manifest(files={"model.pt": FileEntry(1000, "0" * 64)}, step=step))
    unfinished = ckpt / "step_0000016"
    unfinished.mkdir()
    (unfinished / "model.pt").write_bytes(b"x" * 300)
    (ckpt / ".replaced-step_0000012-17").mkdir()

    roomy_enough = what_to_delete(ckpt, keep_last=2, shortfall=100)
    names = [Path(item["path"]).name for item in roomy_enough]
    print(json.dumps(roomy_enough, indent=1))
    assert names == [".replaced-step_0000012-17", "step_0000016", "step_0000004"]
    assert roomy_enough[1]["bytes"] == 300 and "no MANIFEST" in roomy_enough[1]["why"]
    assert "keep_last=2" in roomy_enough[2]["why"]
    short = [Path(item["path"]).name for item in what_to_delete(ckpt, keep_last=2, shortfall=5000)]
    assert short == [".replaced-step_0000012-17", "step_0000016", "step_0000004", "step_0000008"]
    assert "step_0000012" not in short, "the run resumes from the newest complete checkpoint"


# -- the controller on a real full filesystem ---------------------------------------------------------
def test_full_disk_pauses_with_the_filesystem_named_and_resumes_by_itself(run_env, small_filesystem, capsys):
    hook = WebhookServer()
    try:
        cfg, scheduler, ctl = run_env(
            notifications={"urls": [hook.url], "events": ["failure", "hang", "restart", "disk", "finish"]},
            trainer_env={"FAKE_STEPS": "20", "FAKE_CKPT_EVERY": "5", "FAKE_STEP_SECONDS": "0.1"},
        )
        # Room for the planner's estimate of the demo model's checkpoint (~6.5 MB): no warning at first.
        mount = small_filesystem(ctl.paths.root / "checkpoints", 12 * MIB)
        paths = ctl.paths
        ctl.start()
        filler: dict[str, Path] = {}

        def fill_after_first_checkpoint(c) -> bool:
            if not filler and (paths.checkpoint(5) / "MANIFEST.json").exists():
                filler["path"] = fill(mount)  # another writer takes the rest of the filesystem
            return c.state.status == RunStatus.DISK_FULL

        supervise(ctl, 30, until=fill_after_first_checkpoint)
        submissions = scheduler.submissions()
        for _ in range(10):  # paused: nothing restarts, however many passes
            ctl.tick()
            time.sleep(0.05)
        assert ctl.state.status == RunStatus.DISK_FULL and scheduler.submissions() == submissions == 1
        assert ctl.state.restarts == 0 and ctl.state.restarts_without_progress == 0
        assert excluded_nodes(paths) == [], "ENOSPC is not a node fault"
        (paused,) = [e for e in event_dicts(paths) if e["event"] == "disk_full_paused"]
        assert paused["mount"] == str(mount) and paused["free_bytes"] < paused["needed_bytes"]
        disk_notes = [r for r in hook.received if kind_of(r) == "disk" and "paused" in r["message"]]
        assert len(disk_notes) == 1 and "failure" not in hook.kinds(), hook.received

        capsys.readouterr()
        assert runctl(["status", str(paths.root), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        said = " ".join(shown["warnings"])
        print(said)
        assert shown["dashboard"]["status"] == "disk_full" and str(mount) in said and "step_0000010" in said

        filler["path"].unlink()  # the other writer's file is gone, and so is the unfinished save
        shutil.rmtree(paths.checkpoint(10), ignore_errors=True)
        assert supervise(ctl, 30) == RunStatus.FINISHED
        (resumed,) = [e for e in event_dicts(paths) if e["event"] == "disk_full_resumed"]
        assert resumed["how"] == "submitted a job" and scheduler.submissions() == 2
        losses = {m["step"]: m["loss"] for m in read_jsonl(paths.metrics)}
        assert losses == {s: loss_at(s) for s in range(1, 21)}
    finally:
        hook.close()


# -- every output survives ENOSPC -----------------------------------------------------------------
def no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


class FullStream(io.StringIO):
    """stdout on a full disk while `full` is set."""

    def __init__(self):
        super().__init__()
        self.full = True

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


PRIMITIVES = {  # the one write primitive of each output
    "state": "orchestrator.contract.state.atomic_write_json",
    "events": "orchestrator.contract.events.append_jsonl",
    "heartbeat": "orchestrator.contract.controller_beat._replace_json",
}


@pytest.mark.parametrize("output", ["state", "events", "heartbeat", "stdout"])
def test_every_controller_output_survives_enospc(run_env, monkeypatch, caplog, capsys, output):
    from orchestrator.cli.watch_cmd import _plain_logger

    cfg, scheduler, ctl = run_env(trainer_env={"FAKE_STEPS": "30", "FAKE_STEP_SECONDS": "0.05"})
    ctl.start()
    paths = RunPaths.of(ctl.paths.root)
    before = len(event_dicts(paths))  # the plain logger prints the events after these
    plain = _plain_logger(paths.root)
    stream = FullStream()
    if output == "stdout":
        monkeypatch.setattr(sys, "stdout", stream)
    else:
        import importlib

        module, name = PRIMITIVES[output].rsplit(".", 1)
        monkeypatch.setattr(importlib.import_module(module), name, no_space)
    passes = []

    def on_pass(result) -> None:
        passes.append(result)
        if len(passes) == 15:  # space is back
            monkeypatch.undo()
            stream.full = False
            if output == "stdout":
                monkeypatch.setattr(sys, "stdout", stream)
        plain(result)

    caplog.set_level(logging.INFO, logger="runctl.controller")
    assert ctl.run(on_pass=on_pass, max_seconds=60) == RunStatus.FINISHED.value
    # While state.json cannot be written nothing is submitted (the intent goes to disk before
    # sbatch): those passes fail and are retried at the poll cadence; none fails once there is room.
    errors = [r for r in passes[15:] if r.error]
    assert len(passes) > 15 and not errors, errors[:1]
    said = caplog.text + capsys.readouterr().err
    written = {
        "state": lambda: json.loads(paths.state.read_text())["status"] == "finished",
        "events": lambda: any(e["event"] == "run_stopped" for e in event_dicts(paths)),
        "heartbeat": lambda: json.loads(paths.controller_heartbeat.read_text())["passes"] >= len(passes),
        "stdout": lambda: "run stopped (finished)" in [x for x in stream.getvalue().splitlines() if "[watch]" in x][-1],
    }[output]
    expected_words = {
        "state": "No space left on device",
        "events": "cannot write events.jsonl",
        "heartbeat": "cannot write",
        "stdout": "cannot write to stdout",
    }[output]
    print(f"{output}: {len(passes)} passes; said: {expected_words!r} in {said.count(expected_words)} line(s)")
    assert expected_words in said, said[-2000:]
    assert written(), f"{output} not written again once the disk was back: {stream.getvalue()[-600:]!r}"
    if output == "stdout":  # every event in words, none lost while stdout was full
        printed = [line for line in stream.getvalue().splitlines() if line.startswith("[watch]")]
        assert len(printed) == len(event_dicts(paths)) - before
