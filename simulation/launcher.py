"""The job launcher on virtual time: what orchestrator/slurm/launcher does inside one simulated job.

With `cluster.spare_nodes > 0` the job holds nodes + spares; its allocation.json (the contract's
Allocation, written with the contract's writer) waits for decisions: launch 0 runs on the first
`cluster.nodes` nodes, the rest are spares. When a launch fails, the launcher waits up to
`watchdog.relaunch_decision_seconds` for the controller's decision and applies it with the real
launcher's own functions (`decision_for`, `replace_nodes`): leave out the named nodes, take as
many spares, launch K+1 in the same job; no decision, or too few spares, ends the job with the
launch's code (a job-level restart). A decision that arrives while launch K still runs kills its
step first (the controller decided on dead or hung ranks), as `kill_step` does.
Without spares it is the degenerate case: one launch, no decision, the job ends with its code.

The warm standby: the real launcher starts it once launch K trains; so launch K+1 starts warm
when K reached its first step, else cold (simulation/timings.py prices each). Not simulated: the
health check before launch 0 (every node is healthy).
The decision file is looked for after each controller pass (`after_pass`): the controller is its
only writer, so that is when it can appear; the real launcher polls it every 0.5 s.
"""

from __future__ import annotations

from typing import Any

from orchestrator.contract import PURPOSEFUL_EXITS, Allocation, LaunchEnd, LauncherState
from orchestrator.slurm.launcher.launcher import decision_for, replace_nodes

KILLED_STEP_SECONDS = 1.0  # scancel --signal=KILL of a step to srun's return


class SimLauncher:
    def __init__(self, world: Any, job: Any, t: float):
        cfg = world.cfg
        self.world, self.job = world, job
        need = cfg.cluster.nodes
        self.waits = cfg.cluster.spare_nodes > 0
        self.decision_seconds = float(cfg.watchdog.relaunch_decision_seconds)
        nodes = list(job.nodes)
        self.record = Allocation(
            job.job_id, LauncherState.RUNNING, 0, nodes[:need], nodes[need:], waits_for_decisions=self.waits
        )
        self.killing = False
        self.gone = False  # SLURM ended the job (the launcher with it)
        world.record_launch(job.job_id, self.record)
        world.start_incarnation(job, t, self.record.nodes, self.record.launch)

    @property
    def ended(self) -> bool:
        return self.gone or self.record.state is LauncherState.ENDED

    def after_pass(self, t: float) -> None:
        """The controller may have decided: a running launch's step is killed, a waiting launcher relaunches."""
        if self.ended or self.killing:
            return
        decision = decision_for(self.world.paths, self.job.job_id, self.record.launch)
        if decision is None:
            return
        if self.record.state is LauncherState.WAITING_DECISION:
            self._relaunch(t, decision)
            return
        inc = self.world.live.get(self.job.job_id)
        if inc is not None and inc.launch == self.record.launch and inc.gone_at is None:
            self.killing = True
            inc.fault(t)
            self.world.at(
                t + KILLED_STEP_SECONDS,
                lambda when: self.world.processes_exited(inc, when, 137, "srun: error: Step killed\n"),
            )

    def launch_ended(self, t: float, code: int, srun_stderr: str) -> None:
        """srun of the current launch returned with `code`: end the job, or wait for a decision."""
        self.killing = False
        record = self.record
        record.ended = LaunchEnd.from_srun(record.launch, code, srun_stderr)
        if record.ended.exit_code in PURPOSEFUL_EXITS or not self.waits:
            self._end(t, record.ended.describe())
            return
        decision = decision_for(self.world.paths, self.job.job_id, record.launch)
        if decision is not None:
            self._relaunch(t, decision)
            return
        record.state = LauncherState.WAITING_DECISION
        self.world.record_launch(self.job.job_id, record)
        launch = record.launch

        def give_up(when: float) -> None:
            if record.state is LauncherState.WAITING_DECISION and record.launch == launch:
                self._end(when, "no decision from the controller: the job ends (job-level restart)")

        self.world.at(t + self.decision_seconds, give_up)

    def _relaunch(self, t: float, decision: Any) -> None:
        record = self.record
        if replace_nodes(record, decision) is None:
            self._end(t, f"{len(record.spares)} spare(s) left, {len(decision.leave_out)} needed")
            return
        record.state, record.ended = LauncherState.RUNNING, None
        self.world.record_launch(self.job.job_id, record)
        self.world.note("relaunch", t, job_id=self.job.job_id, launch=record.launch, nodes=list(record.nodes))
        self.world.start_incarnation(self.job, t, record.nodes, record.launch, standby=self._trained)

    @property
    def _trained(self) -> bool:
        """The launch before this relaunch reached its first step (the standby was started then)."""
        before = [i for i in self.world.incarnations if i.job_id == self.job.job_id]
        return bool(before) and before[-1].trained_at is not None

    def _end(self, t: float, note: str) -> None:
        record = self.record
        record.state, record.note = LauncherState.ENDED, note
        self.world.record_launch(self.job.job_id, record)
        code = record.ended.exit_code if record.ended is not None else 1
        self.world.slurm.job_exited(self.job, t, code)

    def node_lost(self, t: float, node: str) -> None:
        """SLURM declared a node of this --no-kill job DOWN: a launch running on it ends (srun
        reports its tasks there lost). A spare that dies stays in the record: the real launcher
        does not know either, and its next launch there would fail."""
        inc = self.world.live.get(self.job.job_id)
        if inc is None or inc.gone_at is not None or node not in inc.nodes or self.killing:
            return
        first = inc.nodes.index(node) * self.world.gpus_per_node
        report = f"srun: error: {node}: tasks {first}-{first + self.world.gpus_per_node - 1}: Killed\n"
        self.world.processes_exited(inc, t, 137, report)
