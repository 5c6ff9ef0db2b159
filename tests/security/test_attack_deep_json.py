"""Deeply nested JSON from an operator, and passes that keep failing.

`[` x 4000 in control/kill raised RecursionError, which readers catching only ValueError missed:
every pass failed, the kill was never acted on, and `runctl doctor` still called the controller
healthy. Now the contract's one reader refuses such nesting as its own error (the kill is still a
kill, with no reason), and a controller whose passes keep failing is a problem the doctor reports
with a non-zero exit. The passes here fail for a reason of the owner's own: a heartbeat written by
a newer trainer (ContractVersionError, by design loud rather than guessed at).
Real users (attack_env.py), the real controller on the mocked SLURM (owner_controller.py).
"""

from __future__ import annotations

import json

from attack_env import as_user, runctl_as, uid
from owner_controller import mock_env, submit_as_owner

from orchestrator.contract import RunPaths, atomic_write_json
from orchestrator.contract.requests import read_accepted
from orchestrator.views.doctor import FAILING_PASSES_PROBLEM


def doctor_as_owner(team, paths: RunPaths) -> tuple[int, dict]:
    """`runctl doctor --json` (as cron runs it for the owner): (exit code, its report)."""
    argv = ["doctor", str(paths.root), "--json", "--state-dir", str(paths.root.parent / "doctor")]
    rc, out = runctl_as(team.owner, argv, env=mock_env(paths))
    report = [line for line in out.splitlines() if line.startswith("{")]
    assert report, out
    return rc, json.loads(report[-1])


def test_a_deeply_nested_kill_is_a_kill_and_failing_passes_fail_the_doctor(team, shared_run, owner_controller):
    paths = shared_run(team_dir=True)
    submit_as_owner(team, paths)
    newer = {"version": 99, "rank": 0, "job_id": "1000"}  # a trainer newer than this runctl
    as_user(team.owner, lambda: (paths.heartbeats / "rank-00000.json").write_text(json.dumps(newer)))
    dropped, out = as_user(team.oncall, lambda: paths.control_request("kill").write_text("[" * 4000), umask=0o002)
    assert not isinstance(dropped, BaseException), out

    controller = owner_controller(team, paths)
    for _ in range(FAILING_PASSES_PROBLEM):
        controller.tick()
    rc, report = doctor_as_owner(team, paths)  # the controller is alive, between passes
    results, events = controller.stop()

    accepted = [e for e in events if e["event"] == "request_accepted"]
    assert [(e["request"], e["user"], e["uid"]) for e in accepted] == [("kill", team.oncall, uid(team.oncall))]
    assert [e["reason"] for e in events if e["event"] == "kill_requested"] == ["(none given)"]
    published, _ = as_user(team.owner, lambda: read_accepted(paths, "kill"))
    assert published.user == team.oncall, "the trainer sees the kill"
    assert all(r.error and "ContractVersionError" in r.error for r in results), [r.error for r in results]

    findings = {f["check"]: f for f in report["findings"]}
    print(json.dumps(report["findings"], indent=1))
    assert rc == 1 and not findings["passes"]["ok"], report
    assert f"last {FAILING_PASSES_PROBLEM} passes failed" in findings["passes"]["message"]
    assert [c for c, f in findings.items() if not f["ok"]] == ["passes"], "alive, a job, disk: all fine"


def test_the_doctor_is_fine_with_one_failed_pass(team, shared_run, owner_controller):
    """One failed pass (squeue timing out, say) is routine, not a problem: no page for it."""
    paths = shared_run(team_dir=True)
    submit_as_owner(team, paths)
    newer = {"version": 99, "rank": 0}
    as_user(team.owner, lambda: atomic_write_json(paths.heartbeats / "rank-00000.json", newer))
    controller = owner_controller(team, paths)
    controller.tick()
    rc, report = doctor_as_owner(team, paths)
    results, _ = controller.stop()
    findings = {f["check"]: f for f in report["findings"]}
    assert len(results) == 1 and results[0].error, results
    assert rc == 0 and findings["passes"]["ok"] and "1 failed pass" in findings["passes"]["message"], report
