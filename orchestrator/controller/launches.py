"""The controller's side of restarts inside a job with spares (a mixin of Controller).

The job's launcher (trainer/in_allocation.py) writes jobs/<id>/allocation.json; each pass reads it
for the running job (one small file) and:
- relays the nodes that failed the health check before launch: an event, a notification, and
  the exclude list (so later jobs avoid them; the cap per incident applies);
- when a launch failed and the launcher waits, decides like on a job end (policy.on_launch_failed
  -> recovery), which may be a relaunch on a spare (`Relaunch`) or a job-level restart;
- carries out a relaunch: writes the decision (orchestrator/allocation.py), expects the next
  launch's heartbeats, and follows the recovery to its first step as for any restart.
The contract's files are read as untrusted (owner's, regular, bounded): a malformed or planted
one is an event once, and the job is handled at job level.
"""

from __future__ import annotations

from typing import Any

from orchestrator.allocation import Allocation, ContractError, Decision, read_allocation, write_decision

from .actions import Cancel, Exclude, Notify, Record, Relaunch, Stop
from .detection import culprit_nodes
from .policy import on_launch_failed
from .state import JobRecord, RunStatus
from .submission import failed_task_host


class LaunchTracking:
    """Needs from its host: paths, cfg, state, liveness, clock, monotonic, _event(), apply(),
    _recover(), _begin_recovery()."""

    _allocation_errors: set[str]

    def _allocation(self, job: JobRecord) -> Allocation | None:
        if not self.cfg.cluster.spare_nodes:
            return None  # no spares, no launcher: nothing to read on every pass
        try:
            return read_allocation(self.paths.allocation(job.job_id))
        except ContractError as exc:
            seen = self.__dict__.setdefault("_allocation_errors", set())
            if job.job_id not in seen:
                seen.add(job.job_id)
                self._event("allocation_unreadable", job_id=job.job_id, error=str(exc)[:300])
            return None

    def _decided(self, job: JobRecord, launch: int) -> bool:
        return self.paths.launch_decision(job.job_id, launch).exists()

    def _relay_unhealthy(self, job: JobRecord, allocation: Allocation | None, result: Any) -> None:
        if allocation is None or not allocation.unhealthy:
            return
        seen = set(self.state.unhealthy_relayed)
        new = {n: why for n, why in allocation.unhealthy.items() if f"{job.job_id}:{n}" not in seen}
        if not new:
            return
        self.state.unhealthy_relayed.extend(f"{job.job_id}:{n}" for n in new)
        nodes, why_not = culprit_nodes(sorted(new), self.cfg.watchdog.max_excluded_per_incident)
        actions: list[Any] = [
            Record(
                "nodes_unhealthy", {"job_id": job.job_id, "nodes": new, "excluded": nodes, "why_not": why_not}
            ),
            Notify(
                "failure",
                f"job {job.job_id}: {len(new)} node(s) failed the health check before launch: "
                + "; ".join(f"{n}: {why}" for n, why in sorted(new.items())[:4]),
                {"job_id": job.job_id, "nodes": sorted(new)},
            ),
        ]
        if nodes:
            actions.append(
                Exclude(tuple(nodes), "failed the health check before launch", job.job_id, "unhealthy")
            )
        self.apply(actions, result)

    def _on_launch_failed(
        self, job: JobRecord, allocation: Allocation, beats: list[dict[str, Any]], result: Any
    ) -> None:
        if self.state.status == RunStatus.KILLING:  # the kill switch wins: never relaunch
            self.apply(
                [
                    Cancel((job.job_id,), "killed (a launch failed while saving)"),
                    Stop(
                        RunStatus.KILLED,
                        "kill",
                        "run stopped by the kill switch (a launch failed while saving)",
                    ),
                ],
                result,
            )
            return
        host, what = failed_task_host(self.paths.launch_stderr(job.job_id, allocation.launch))
        steps = [
            b.get("step")
            for b in beats
            if str(b.get("job_id")) == job.job_id
            and b.get("launch", 0) == allocation.launch
            and isinstance(b.get("step"), int)
        ]
        # When it failed, on this controller's clocks: the launch's ranks stopped beating then (the
        # longest a rank's beat has not changed); never a node's timestamp (liveness.py).
        mono, wall = self.monotonic(), self.clock()
        ages = [mono - view.beat_changed for view in self.liveness.ranks.values()]
        actions, failure = on_launch_failed(
            job,
            allocation,
            srun_host=host,
            srun_says=what,
            last_step=max(steps) if steps else None,
            wall_now=wall,
            failure_time=wall - max(ages, default=0.0),
        )
        self.apply(actions, result)
        self._recover(failure, result)

    def _relaunch(self, action: Relaunch, result: Any) -> None:
        """Tell the launcher to launch again (on spares for the nodes left out)."""
        decision = Decision(
            action.launch,
            "relaunch",
            action.leave_out,
            f"{action.cause}: relaunch from step {action.resume_step}",
        )
        write_decision(self.paths.launch_decision(action.failed_job_id, action.launch), decision)
        self.liveness.expect_new_incarnation(after_launch=action.launch)
        left = f"leaving out {', '.join(action.leave_out)}" if action.leave_out else "on the same nodes"
        how = (
            f"inside job {action.failed_job_id}: launch {action.launch + 1} {left} "
            f"({action.spares_left} spare(s) left)"
        )
        self._begin_recovery(action, action.failed_job_id, how, in_allocation=True)
        result.actions.append(f"relaunch: {how}")
