"""What operators and other users drop in control/.

Each test plays the attack as the attacking Unix user, then runs the controller's request intake
(orchestrator.controller.requests.read_requests) as the owner, and checks that the attack was
refused, recorded under the attacker's real name, and that a genuine request still works after it.
"""

from __future__ import annotations

import json
import os
import stat

from attack_env import as_user, operators_of, runctl_as, uid

from orchestrator.contract import RunPaths
from orchestrator.contract.client.stop import Controls
from orchestrator.contract.operators import prepare_permissions, read_audit
from orchestrator.contract.requests import publish_request
from orchestrator.controller.requests import read_requests
from orchestrator.errors import EXIT_PERMISSION

SECRET = "-----BEGIN PRIVATE KEY----- owner's secret"


def owner_secret(team, paths: RunPaths):
    """A 0600 file of the owner's, outside the run (think ~/.ssh/id_rsa)."""
    path = paths.root.parent / "id_rsa"

    def make():
        path.write_text(SECRET)
        os.chmod(path, 0o600)

    as_user(team.owner, make)
    return path


def intake(team, paths: RunPaths):
    result, out = as_user(team.owner, lambda: read_requests(paths, operators_of(paths)))
    assert not isinstance(result, BaseException), out
    return result


def drop(user: str, path, body) -> None:
    def write():
        path.write_text(body if isinstance(body, str) else json.dumps(body))

    result, out = as_user(user, write)
    assert not isinstance(result, BaseException), out


def audit_text(paths: RunPaths) -> str:
    return paths.audit.read_text()


def test_symlink_planted_in_control_is_never_followed(team, shared_run):
    """Hole 1: control/x -> ~owner/.ssh/id_rsa must not be chmodded, chowned nor read."""
    paths = shared_run()
    secret = owner_secret(team, paths)
    before = os.stat(secret)
    planted, out = as_user(
        team.oncall,
        lambda: (os.symlink(secret, paths.control / "x"), os.symlink(secret, paths.control / "kill")),
    )
    assert not isinstance(planted, BaseException), out
    warnings, out = as_user(team.owner, lambda: prepare_permissions(paths, operators_of(paths)))
    assert not isinstance(warnings, BaseException), out
    after = os.stat(secret)
    assert (after.st_mode, after.st_gid) == (before.st_mode, before.st_gid), "the secret's mode/group changed"

    got = intake(team, paths)
    assert "kill" not in got.requests
    moved = [e for e in got.events if e.KIND == "quarantined"]
    assert moved and moved[0].kind == "symbolic link" and moved[0].user == team.oncall
    assert SECRET not in audit_text(paths)
    assert os.path.islink(moved[0].moved_to) and secret.read_text() == SECRET
    # Nothing lost: a genuine request after the attack is accepted.
    drop(team.oncall, paths.control_request("kill"), {"reason": "real one"})
    assert intake(team, paths).requests["kill"].user == team.oncall


def test_request_is_authenticated_by_file_owner_and_trainer_obeys_only_accepted(team, shared_run):
    """Hole 4: the JSON's "user" is self-declared; the trainer obeyed any control/kill."""
    paths = shared_run()
    forged = {"user": team.owner, "reason": "x\x1b[2J\nFAKE 12:00 owner kill allowed", "now": True}
    drop(team.oncall, paths.control_request("kill"), forged)

    controls = Controls(
        paths,
        rank=0,
        job_start_time=0,
        exit_duration_minutes=None,
        checkpoint_interval_hours=None,
        pre_timeout_signal=None,
    )
    assert as_user(team.owner, controls.kill_requested)[0] is False, (
        "control/kill alone must not stop the trainer"
    )

    got = intake(team, paths)
    request = got.requests["kill"]
    assert (request.user, request.uid, request.now) == (team.oncall, uid(team.oncall), True)
    assert "\n" not in request.reason and "\x1b" not in request.reason
    lines = read_audit(paths)
    assert [(r.user, r.allowed, r.action) for r in lines] == [(team.oncall, True, "kill --now")]
    again = intake(team, paths)  # processed once: no second audit line, no second event
    assert again.requests["kill"] == request and again.events == [] and len(read_audit(paths)) == 1

    as_user(team.owner, lambda: publish_request(paths, request))
    assert stat.S_IMODE(paths.accepted_request("kill").stat().st_mode) == 0o644
    seen, out = as_user(team.owner, lambda: (controls.kill_requested(), controls.kill_request))
    assert seen[0] is True and seen[1].user == team.oncall, out
    # An operator cannot write accepted/ (nor the audit trail) to skip the controller.
    for target in (paths.accepted / "kill", paths.audit):
        result, _ = as_user(team.oncall, lambda t=target: open(t, "a").write("{}"))
        assert isinstance(result, PermissionError), f"{team.oncall} could write {target}"


def test_touch_garbage_and_lists_are_kill_requests(team, shared_run):
    """An empty file, non-JSON or a JSON list still means kill (reason "(none given)")."""
    paths = shared_run()
    for body in ("", "not json {", "[1, 2]", json.dumps({"reason": 7})):
        drop(team.oncall, paths.control_request("kill"), body)
        got = intake(team, paths)
        assert got.requests["kill"].reason == "(none given)", body
        as_user(team.oncall, lambda: paths.control_request("kill").unlink())
        assert "kill" not in intake(team, paths).requests


def test_rollback_request_is_authenticated_audited_with_its_ask_and_a_malformed_one_refused(team, shared_run):
    """`runctl rollback`'s request: who asked from the file's owner, what was asked in the audit
    record; an ask that is not a valid directive is refused (naming the field) and quarantined."""
    paths = shared_run()
    ask = {"to_step": 20, "skip_samples": [[160, 216]], "lr_scale": 0.5, "lr_scale_steps": 10}
    drop(team.oncall, paths.control_request("rollback"), {"user": team.owner, "reason": "spike", "rollback": ask})
    got = intake(team, paths)
    request = got.requests["rollback"]
    assert (request.user, request.rollback.to_step, request.rollback.skip_samples) == (team.oncall, 20, ((160, 216),))
    audited = read_audit(paths)[-1]
    assert (audited.user, audited.allowed, audited.action, audited.details) == (team.oncall, True, "rollback", ask)
    as_user(team.oncall, lambda: paths.control_request("rollback").unlink())

    bad = {"reason": "spike", "rollback": {"to_step": 20, "skip_samples": [[216, 160]]}}
    drop(team.oncall, paths.control_request("rollback"), bad)
    got = intake(team, paths)
    assert "rollback" not in got.requests and not paths.control_request("rollback").exists()
    refused = read_audit(paths)[-1]
    assert (refused.user, refused.allowed, refused.action) == (team.oncall, False, "rollback")
    [why] = [e.why for e in got.events if e.KIND == "request_refused"]
    assert "skip_samples[0]" in why, why
    assert len(os.listdir(paths.quarantine)) == 1


def test_non_operator_request_and_hard_link_are_refused_and_quarantined(team, shared_run):
    paths = shared_run()
    result, _ = as_user(team.outsider, lambda: paths.control_request("kill").write_text("{}"))
    assert isinstance(result, PermissionError), "control/ must not be writable by a non-operator"
    # A file of the outsider's that got there anyway (e.g. written while they were in the group).
    paths.control_request("kill").write_text(json.dumps({"user": team.owner, "reason": "mine now"}))
    os.chown(paths.control_request("kill"), uid(team.outsider), -1)
    got = intake(team, paths)
    assert "kill" not in got.requests and not paths.control_request("kill").exists()
    refused = read_audit(paths)[-1]
    assert (refused.user, refused.allowed) == (team.outsider, False)
    assert any(e.KIND == "request_refused" for e in got.events)
    assert len(os.listdir(paths.quarantine)) == 1

    # A hard link to a file of the owner's would pass as the owner's request and leak its bytes
    # (made as root here: fs.protected_hardlinks stops users on this host, not on every site).
    secret = owner_secret(team, paths)
    os.link(secret, paths.control_request("resume"))
    got = intake(team, paths)
    assert "resume" not in got.requests and SECRET not in audit_text(paths)
    assert secret.read_text() == SECRET


def test_fifo_and_oversized_request_do_not_block_and_are_handled_once(team, shared_run):
    paths = shared_run()
    as_user(team.oncall, lambda: os.mkfifo(paths.control_request("resume")))
    drop(team.oncall, paths.control_request("kill"), "x" * 100_000)
    got = intake(team, paths)  # as_user fails the test if this blocks
    assert got.requests == {} and len([e for e in got.events if e.KIND == "quarantined"]) == 2
    assert intake(team, paths).events == [], "handled once, not on every pass"


def test_listed_user_outside_the_group_gets_a_fix_not_a_traceback(team, shared_run):
    paths = shared_run()
    rc, out = runctl_as(team.listed, ["kill", str(paths.root), "--reason", "on call"])
    assert rc == EXIT_PERMISSION and "Traceback" not in out and "crashed" not in out, out
    assert team.group in out and "operators" in out
    # Allowed to read the run (as an ACL u:listed:rx would), still not to write control/.
    os.chmod(paths.root, 0o2755)
    os.chmod(paths.config, 0o644)
    rc, out = runctl_as(team.listed, ["kill", str(paths.root), "--reason", "on call"])
    assert rc == EXIT_PERMISSION and "Traceback" not in out and "crashed" not in out, out
    assert "cannot write" in out and team.group in out and "setfacl" in out, out
    assert read_audit(paths) == [], "no audit line claims an allowed action that did not happen"


def test_kill_without_controller_says_nothing_stops_the_job(team, shared_run):
    paths = shared_run()
    rc, out = runctl_as(team.oncall, ["kill", str(paths.root), "--reason", "loss spike"])
    assert rc == 0 and "NO CONTROLLER" in out and "runctl watch" in out, out


def test_watch_by_non_owner_is_refused(team, shared_run):
    paths = shared_run()
    rc, out = runctl_as(team.oncall, ["watch", str(paths.root), "--once"])
    assert rc == EXIT_PERMISSION and "only the owner" in out, out
    assert not (paths.root / "controller.lock").exists()
