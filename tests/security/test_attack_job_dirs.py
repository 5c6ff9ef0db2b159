"""What is made under jobs/<id>/ during a run, attacked by an operator
of the team while the owner works under umask 002 in a setgid team directory.

- jobs/<id>/ is owner-only (0700) from the submission on, whoever makes it first (`runctl submit`,
  the controller's submitter, the job script, the launcher): an operator cannot plant anything.
- A job folder that is open anyway (made by an older runctl's job script under umask 002, where
  the site sets setgid on every folder of a project: `chmod -R g+s`) is found by the trust check
  the controller runs when a new job folder appears: an event and a notification, never a crash;
  what is planted there is neither followed nor blocked on, and a planted decision is not one.
- The launcher's srun report comes from srun's pipe: a forged or linked stderr file changes
  nothing and destroys nothing.
Real users (attack_env.py), the real controller on the mocked SLURM (owner_controller.py).
"""

from __future__ import annotations

import grp
import io
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from attack_env import as_user, start_as, uid
from fakes import WebhookServer, make_config
from owner_controller import mock_env, submit_as_owner, wait_for

from orchestrator.contract import (
    Allocation,
    Decision,
    LaunchEnd,
    LauncherState,
    RunPaths,
    atomic_write_json,
    read_decision,
    write_allocation,
)
from orchestrator.plan.config import dump_config
from orchestrator.slurm.launcher.launcher import JobPlan, Launcher
from orchestrator.slurm.launcher.srun_lines import Layout
from orchestrator.slurm.launcher.steps import Step

FORGED_REPORT = "srun: error: node02: task 1: Killed\n"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def project_tree(team, paths: RunPaths) -> None:
    """The site keeps a team's project tree in the team's group, setgid (`chgrp -R team; chmod -R
    g+s`): jobs/ too (not writable by the group: the trust check at start passes)."""

    def site_policy():
        os.chown(paths.jobs, -1, grp.getgrnam(team.group).gr_gid)
        os.chmod(paths.jobs, 0o2750)

    as_user(team.owner, site_policy)


def open_like_an_older_job_script(team, paths: RunPaths, job_id: str) -> Path:
    """The job folder as an older job script left it: `mkdir -p` under the owner's umask 002 in the
    setgid jobs/ of project_tree: 2775, the team's group."""
    folder = paths.job_dir(job_id)

    def reopen():
        folder.mkdir(exist_ok=True)
        os.chmod(folder, 0o2775)

    as_user(team.owner, reopen, umask=0o002)
    assert os.stat(folder).st_gid == os.stat(paths.root).st_gid, "the team's group, as under a setgid folder"
    return folder


def test_job_folders_are_owner_only_from_the_submission_on(team, shared_run):
    """Hole 3: `runctl submit` and the controller's submitter (the same submit_job) made
    jobs/<id>/ with the caller's umask: 2775 under 002 in a setgid project tree."""
    paths = shared_run(team_dir=True)
    project_tree(team, paths)
    by_controller = paths.job_dir(submit_as_owner(team, paths))  # no CLI umask around it
    base = paths.root.parent
    config, other_run = base / "other.yaml", base / "other-run"
    as_user(team.owner, lambda: config.write_text(dump_config(make_config(operators={"group": team.group}))))
    rc, out = as_user(
        team.owner,
        lambda: runctl_as_self(["submit", str(config), "--run-dir", str(other_run), "--skip-host-checks"]),
        umask=0o002, env=mock_env(paths),
    )[0]  # fmt: skip
    assert rc == 0, out
    by_cli = [p for p in RunPaths.of(other_run).jobs.iterdir() if p.is_dir()]
    folders = [by_controller, *by_cli]
    assert len(folders) == 2 and [mode_of(p) for p in folders] == [0o700, 0o700], folders
    for folder in folders:
        planted, _ = as_user(team.oncall, lambda f=folder: os.symlink(paths.latest, f / "launch-0.srun.stderr"))
        assert isinstance(planted, PermissionError), f"{team.oncall} could plant a link in {folder}"


def runctl_as_self(argv: list[str]) -> tuple[int, str]:
    import io  # noqa: PLC0415
    from contextlib import redirect_stderr, redirect_stdout  # noqa: PLC0415

    from orchestrator.cli.main import main  # noqa: PLC0415

    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        rc = main(argv)
    return rc, out.getvalue()


@pytest.fixture
def webhook():
    server = WebhookServer()
    yield server
    server.close()


def test_an_open_job_folder_is_reported_and_what_is_planted_there_never_followed(
    team, shared_run, owner_controller, webhook
):
    """Hole 3: the trust check ran only at start; a FIFO planted in a job folder hung the
    controller, a planted link was followed."""
    paths = shared_run(team_dir=True, notifications={"urls": [webhook.url], "events": ["failure"]})
    project_tree(team, paths)
    job_id = submit_as_owner(team, paths, folder=False)  # its folder appears when it starts
    controller = owner_controller(team, paths)  # started: everything is the owner's so far
    controller.tick()
    folder = open_like_an_older_job_script(team, paths, job_id)  # the job starts

    def plant():
        os.mkfifo(folder / "allocation.json")
        os.symlink(paths.latest, folder / "launch-0.srun.stderr")
        (folder / "decisions").mkdir()
        os.mkfifo(folder / "decisions" / "launch-0.json")

    planted, out = as_user(team.oncall, plant, umask=0o002)
    assert not isinstance(planted, BaseException), out
    began = time.monotonic()
    controller.tick()  # a blocked open would time out here
    print(f"pass over the planted FIFOs: {time.monotonic() - began:.2f} s")
    results, events = controller.stop()
    assert [r.error for r in results] == [None, None], results
    trust = [e for e in events if e["event"] == "trust_problem"]
    assert len(trust) == 1 and trust[0]["job_ids"] == [job_id], trust
    assert any(str(folder) in p and f"writable by group {team.group}" in p for p in trust[0]["problems"]), trust
    unreadable = [e for e in events if e["event"] == "allocation_unreadable"]
    assert unreadable and "not a regular file" in unreadable[0]["error"], events
    failed = [e for e in events if e["event"] == "notification_failed"]
    assert any("writable by others" in str(post) for post in webhook.received), (webhook.received, failed)
    assert stat.S_ISFIFO(os.lstat(folder / "allocation.json").st_mode), "left as evidence, never opened for long"


def test_a_planted_decision_is_not_the_controllers(team, shared_run, owner_controller):
    """Hole 10: a planted decisions/launch-K.json made the controller believe it had decided
    (`.exists()`): the failed launch was never relaunched."""
    paths = shared_run(team_dir=True, cluster={"spare_nodes": 1})
    project_tree(team, paths)
    job_id = submit_as_owner(team, paths)
    waiting = Allocation(
        job_id, LauncherState.WAITING_DECISION, 0, ["node01", "node02", "node03", "node04"], ["node05"],
        ended=LaunchEnd.from_srun(0, 1, "srun: error: node02: task 1: Killed\n"), waits_for_decisions=True,
    )  # fmt: skip
    as_user(team.owner, lambda: write_allocation(paths.allocation(job_id), waiting))
    controller = owner_controller(team, paths)
    folder = open_like_an_older_job_script(team, paths, job_id)
    forged = Decision(0, "relaunch", ("node01",), "forged by an operator")

    def plant():
        (folder / "decisions").mkdir()
        atomic_write_json(paths.launch_decision(job_id, 0), forged.to_dict())

    planted, out = as_user(team.oncall, plant, umask=0o002)
    assert not isinstance(planted, BaseException), out
    assert os.stat(paths.launch_decision(job_id, 0)).st_uid == uid(team.oncall)
    controller.tick()
    results, events = controller.stop()
    assert [r.error for r in results] == [None], results
    restarts = [e for e in events if e["event"] == "restart"]
    assert restarts and restarts[0]["in_allocation"] is True, [e["event"] for e in events]
    decided, out = as_user(team.owner, lambda: read_decision(paths.launch_decision(job_id, 0)))
    assert isinstance(decided, Decision), out
    assert decided.leave_out == ("node02",) and decided != forged


def test_the_launchers_srun_report_comes_from_its_pipe_not_from_a_file(team, shared_run):
    """Hole 3: a link planted as launch-K.srun.stderr made the launcher append srun's errors to
    checkpoints/latest; a forged stderr file blamed a good node."""
    paths = shared_run(team_dir=True)
    project_tree(team, paths)
    as_user(team.owner, lambda: paths.latest.write_text("step_0000001\n"))
    folder = open_like_an_older_job_script(team, paths, "555")
    stderr = paths.launch_stderr("555", 0)
    planted, out = as_user(team.oncall, lambda: os.symlink(paths.latest, stderr))
    assert not isinstance(planted, BaseException), out
    flags = paths.root.parent
    srun = "echo 'srun: error: node01: task 0: Exited with exit code 3' >&2; exit 3"

    def launch() -> LaunchEnd:
        sys.stderr = io.TextIOWrapper(io.BytesIO())  # the job's output (the tee writes its bytes)
        step = Step.start(["sh", "-c", srun], dict(os.environ), "launch-0", 0, ["node01", "node02"], stderr)
        step.proc.wait()
        step.copier.join(10)
        (flags / "ran").touch()
        wait_for(flags / "forged", 20)
        return step.finish(timeout=10)

    def forge():  # replace the launcher's file with one that blames node02
        fake = folder / ".forged"
        fake.write_text(FORGED_REPORT)
        os.rename(fake, stderr)

    launcher = start_as(team.owner, launch, umask=0o022)
    try:
        wait_for(flags / "ran")
        forged, out = as_user(team.oncall, forge, umask=0o002)
        assert not isinstance(forged, BaseException), out
        (flags / "forged").touch()
        end, out = launcher.result()
    finally:
        launcher.kill()
    assert isinstance(end, LaunchEnd), out
    assert (end.exit_code, end.failed_host) == (3, "node01"), end
    assert paths.latest.read_text() == "step_0000001\n", "srun's errors were appended through the link"
    assert stderr.read_text() == FORGED_REPORT, "the operator's file, never read by the launcher"


def test_a_health_result_someone_else_wrote_never_passes_a_node(team, shared_run):
    """Hole 3: a replaced health/<node>.json decided a node's health. The launcher takes only
    results of the run's owner (a forged "ok" for a broken node is refused)."""
    paths = shared_run(team_dir=True)
    project_tree(team, paths)
    folder = open_like_an_older_job_script(team, paths, "555")
    as_user(team.owner, lambda: (folder / "health").mkdir(mode=0o2775), umask=0o002)
    forged = {"ok": True, "node": "node01", "reason": "all checks passed"}
    planted, out = as_user(team.oncall, lambda: atomic_write_json(folder / "health" / "node01.json", forged))
    assert not isinstance(planted, BaseException), out
    plan = JobPlan(paths.root, Layout(1, 1, 1, 60), ["python3", "-m", "trainer", str(paths.root)], 0.0, True, 60.0)

    def read_result():
        return Launcher(plan, env={"SLURM_JOB_ID": "555"})._health_result(folder / "health" / "node01.json")

    (ok, reason, problem), out = as_user(team.owner, read_result)
    assert ok is False and "cannot be trusted" in reason and f"uid {uid(team.oncall)}" in reason, (ok, reason)
