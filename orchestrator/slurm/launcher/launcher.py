"""The launcher of one job (see the package docstring): health, launches, decisions."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.contract import (
    PURPOSEFUL_EXITS,
    Allocation,
    ContractError,
    Decision,
    ExitCode,
    HeartbeatReader,
    LaunchEnd,
    LauncherState,
    Phase,
    RunPaths,
    read_decision,
    read_owned_json,
    write_allocation,
)
from orchestrator.contract.allocation import StandbyGo, write_standby_go
from orchestrator.contract.client.supervision import RUN_DIR_VARIABLE
from orchestrator.contract.filemodes import NotPrivateError, private_dir
from orchestrator.slurm.nodes import node_address, slurm_hostnames

from .srun_lines import Layout, health_argv, keeps_warm, launch_argv, master_port, standby_argv
from .steps import Step, kill_step

POLL_SECONDS = 0.5
# srun's own variables from the batch step describe the whole allocation (spares included); each
# launch says its own layout on the command line instead.
ALLOCATION_WIDE = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_NODELIST")


def log(message: str) -> None:
    print(f"runctl launcher: {message}; {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)


class LauncherError(RuntimeError):
    """Something the job cannot run with; the message says what to fix."""


@dataclass(frozen=True)
class JobPlan:
    """What the job script told the launcher (its command line)."""

    run_dir: Path
    layout: Layout
    command: list[str]  # what each task runs: our trainer (<python> -m trainer RUN_DIR) or cluster.command
    decision_seconds: float  # > 0: a job with spares waits this long for the controller's decision
    health: bool
    health_seconds: float
    python: str = ""  # the interpreter with this package on the nodes (health check, standby); "": command[0]


def master_address(node: str) -> str:
    try:
        return node_address(node)
    except OSError:
        raise LauncherError(
            f"cannot resolve {node} (its NodeAddr) to an address: fix DNS, /etc/hosts or NodeAddr in slurm.conf"
        ) from None


def owner_only_dir(path: Path) -> None:
    """The job folder, made before the launcher writes anything in it (its files are evidence the
    controller acts on): owner-only (filemodes.private_dir), or the job cannot run."""
    try:
        private_dir(path)
    except NotPrivateError as exc:
        raise LauncherError(f"{exc}, then resubmit") from None


class Launcher:
    def __init__(self, plan: JobPlan, env: dict[str, str] | None = None):
        self.plan = plan
        self.env = dict(os.environ if env is None else env)
        self.job_id = self.env["SLURM_JOB_ID"]
        self.paths = RunPaths.of(plan.run_dir)
        self.job_dir = self.paths.job_dir(self.job_id)
        self.record: Allocation | None = None
        self.standby: Step | None = None
        self._beats = HeartbeatReader(self.paths.heartbeats)

    # The whole job ----------------------------------------------------------------------------
    def run(self) -> int:
        owner_only_dir(self.job_dir)
        allocated = slurm_hostnames(self.env["SLURM_JOB_NODELIST"])
        waits = self.plan.decision_seconds > 0
        self.record = Allocation(
            self.job_id, LauncherState.HEALTH_CHECK, 0, [], list(allocated), waits_for_decisions=waits
        )
        self._save()
        healthy, unhealthy, problem = self._health(allocated) if self.plan.health else (allocated, {}, "")
        record = self.record
        record.unhealthy = unhealthy
        need = self.plan.layout.nodes
        if problem:
            return self._end(
                int(ExitCode.UNHEALTHY_NODES), f"the allocation failed its health check as a whole: {problem}"
            )
        if len(healthy) < need:
            return self._end(
                int(ExitCode.UNHEALTHY_NODES),
                f"{len(healthy)} healthy nodes of {len(allocated)}, the run needs {need}: "
                + "; ".join(f"{n}: {why}" for n, why in unhealthy.items()),
            )
        record.nodes, record.spares = healthy[:need], healthy[need:]
        while True:
            end = self._launch()
            if end.exit_code in PURPOSEFUL_EXITS or not waits:
                return self._end(end.exit_code, end.describe())
            decision = self._await_decision(end)
            if decision is None:
                return self._end(
                    end.exit_code, "no decision from the controller: the job ends (job-level restart)"
                )
            if not self._replace(decision):
                return self._end(
                    end.exit_code, f"{len(record.spares)} spare(s) left, {len(decision.leave_out)} needed"
                )

    def _end(self, code: int, note: str) -> int:
        assert self.record is not None
        self._drop_standby()
        self.record.state, self.record.note = LauncherState.ENDED, note
        self._save()
        log(f"{note}; exit code {code}")
        return code

    def _save(self) -> None:
        assert self.record is not None
        write_allocation(self.paths.allocation(self.job_id), self.record)

    @property
    def python(self) -> str:
        return self.plan.python or self.plan.command[0]

    def _step_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in ALLOCATION_WIDE}
        env[RUN_DIR_VARIABLE] = str(self.paths.root)  # where any loop's client finds the run
        env.update(extra)
        return env

    # Health -------------------------------------------------------------------------------
    def _health(self, nodes: list[str]) -> tuple[list[str], dict[str, str], str]:
        """`trainer.health` on every node at once; a node whose result is missing or not ok is
        unhealthy (the reason is its own, or that it did not answer). The third value is set when
        the check failed in a way no node is to blame for (the all-reduce across the allocation:
        `allocation_problem` in the results): the job restarts at job level, excluding nobody."""
        results = self.paths.health(self.job_id)
        if results.is_symlink():
            results.unlink()
        for stale in results.glob("*.json") if results.is_dir() else []:
            stale.unlink()  # a requeued job (same id) must not read its last run's results
        argv = health_argv(self.plan.layout, nodes, self.python, str(self.paths.root), str(self.job_dir))
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=self._step_env({}))
        try:
            proc.wait(timeout=self.plan.health_seconds + 15)  # the checker itself gives up at 0.95 x
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)  # srun: a second SIGINT within 1 s cancels the step
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        healthy, unhealthy, problems = [], {}, set()
        for node in nodes:
            ok, reason, problem = self._health_result(results / f"{node}.json")
            if problem:
                problems.add(problem)
            if ok:
                healthy.append(node)
            else:
                unhealthy[node] = reason
        log(f"health check of {len(nodes)} nodes in {time.monotonic() - started:.1f} s: "
            f"{len(healthy)} healthy" + (f", unhealthy: {unhealthy}" if unhealthy else "")
            + (f"; allocation problem: {'; '.join(sorted(problems))}" if problems else ""))  # fmt: skip
        return healthy, unhealthy, "; ".join(sorted(problems))

    def _health_result(self, path: Path) -> tuple[bool, str, str]:
        """(ok, reason, allocation problem) of one node's result file (trainer/health)."""
        try:
            data = read_owned_json(path)
        except ContractError as exc:
            return False, f"its health result cannot be trusted: {exc}"[:300], ""
        if not isinstance(data, dict):
            return False, f"no health result within {self.plan.health_seconds:.0f} s", ""
        ok = data.get("ok") is True
        reason = str(data.get("reason") or "failed the health check")[:300]
        problem = str(data.get("allocation_problem") or "")[:300]
        return ok, reason, problem

    # Launches -----------------------------------------------------------------------------
    def _launch(self) -> LaunchEnd:
        """Run launch K on its nodes: the warm standby step when it covers them, else a new srun
        step. A decision for K that arrives meanwhile kills its step; once K trains, the standby
        for K+1 is started (jobs with spares)."""
        record = self.record
        assert record is not None
        k, nodes = record.launch, record.nodes
        port = master_port(self.job_id, k)
        master = master_address(nodes[0])
        record.state, record.ended, record.standby_ready = LauncherState.RUNNING, None, False
        self._save()
        warm = self.standby is not None and self.standby.launch == k and self.standby.covers(nodes)
        if warm:
            launch = self.standby
            self.standby = None
            launch.stderr_path = self.paths.launch_stderr(self.job_id, k)
            go = StandbyGo(k, tuple(nodes), self.plan.layout.tasks_per_node, master, port)
            write_standby_go(self.paths.standby_go(self.job_id, k), go)
        else:
            self._drop_standby()
            env = self._step_env({"MASTER_ADDR": master, "MASTER_PORT": str(port), "RUNCTL_LAUNCH": str(k)})
            argv = launch_argv(self.plan.layout, k, nodes, self.plan.command)
            launch = Step.start(argv, env, f"launch-{k}", k, nodes, self.paths.launch_stderr(self.job_id, k))
        log(f"launch {k} on {','.join(nodes)} ({'warm standby' if warm else 'cold start'}; spares: "
            f"{','.join(record.spares) or 'none'}); MASTER_ADDR={master} MASTER_PORT={port}")  # fmt: skip
        killed = False
        while launch.proc.poll() is None:
            if not killed and record.waits_for_decisions and self._decision(k) is not None:
                log(f"the controller decided about launch {k} while it runs: killing its step")
                killed = kill_step(self.job_id, launch.name)
            if self.standby is None and self.warm_standby and self._training(k):
                self._start_standby(k + 1)
            self._note_standby_ready()
            time.sleep(POLL_SECONDS)
        record.ended = launch.finish()
        log(f"launch {k} ended: {record.ended.describe()}")
        return record.ended

    # The warm standby (trainer/standby.py) ------------------------------------------------------
    @property
    def warm_standby(self) -> bool:
        """Only our trainer can be kept warm (srun_lines.keeps_warm: any other command is relaunched
        cold), and only when another launch may follow (a job with spares)."""
        return self.plan.decision_seconds > 0 and keeps_warm(self.plan.command)

    def _training(self, launch: int) -> bool:
        """Rank 0 of this launch reached its first step (the standby's imports would slow its init)."""
        try:  # rank 0's beat is in its node's file, or its own where it is alone on its node
            beats = self._beats.read()
        except ContractError:
            return False
        return any(
            beat.rank == 0
            and beat.job_id == self.job_id
            and beat.launch == launch
            and beat.phase is Phase.STEP
            for beat in beats
        )

    def _start_standby(self, launch: int) -> None:
        record = self.record
        assert record is not None
        nodes = record.nodes + record.spares
        go_file = str(self.paths.standby_go(self.job_id, launch))
        argv = standby_argv(self.plan.layout, launch, nodes, self.python, go_file, self.plan.command)
        stderr = self.paths.standby_stderr(self.job_id, launch)
        self.standby = Step.start(argv, self._step_env({}), f"standby-{launch}", launch, nodes, stderr)
        log(f"standby for launch {launch} warming up on {','.join(nodes)}")

    def _note_standby_ready(self) -> None:
        """allocation.json says when every standby task is warm (for people, tests, benchmarks)."""
        record, standby = self.record, self.standby
        if record is None or standby is None or record.standby_ready:
            return
        ready = self.paths.standby_ready(self.job_id, standby.launch)
        tasks = len(standby.nodes) * self.plan.layout.tasks_per_node
        if ready.is_dir() and len(os.listdir(ready)) >= tasks:
            record.standby_ready = True
            self._save()
            log(f"standby for launch {standby.launch} is warm ({tasks} tasks)")

    def _drop_standby(self) -> None:
        if self.standby is not None:
            if self.standby.proc.poll() is None:
                kill_step(self.job_id, self.standby.name)
            self.standby.finish(timeout=30)
            self.standby = None

    # Decisions ----------------------------------------------------------------------------------
    def _decision(self, k: int) -> Decision | None:
        return decision_for(self.paths, self.job_id, k)

    def _await_decision(self, end: LaunchEnd) -> Decision | None:
        record = self.record
        assert record is not None
        decision = self._decision(record.launch)
        if decision is not None:
            return decision
        record.state = LauncherState.WAITING_DECISION
        self._save()
        log(f"launch {record.launch} failed ({end.describe()}): waiting up to "
            f"{self.plan.decision_seconds:.0f} s for the controller's decision")  # fmt: skip
        deadline = time.monotonic() + self.plan.decision_seconds
        while time.monotonic() < deadline:
            decision = self._decision(record.launch)
            if decision is not None:
                return decision
            time.sleep(POLL_SECONDS)
        return None

    def _replace(self, decision: Decision) -> bool:
        """Leave out the decided nodes, take as many spares; False when there are not enough."""
        assert self.record is not None
        swap = replace_nodes(self.record, decision)
        if swap is None:
            return False
        log(f"relaunching as launch {self.record.launch}: "
            + (", ".join(f"{a} -> {b}" for a, b in swap.items()) or "on the same nodes"))  # fmt: skip
        return True


# The launcher's decision logic, also run by the simulation (simulation/launcher.py) ---------------
def decision_for(paths: RunPaths, job_id: str, k: int) -> Decision | None:
    """The controller's decision about launch k of the job, if it wrote one that is for launch k."""
    try:
        decision = read_decision(paths.launch_decision(job_id, k))
    except ContractError as exc:
        log(f"ignoring the decision file for launch {k}: {exc}")
        return None
    if decision is not None and decision.launch != k:
        log(f"ignoring a decision for launch {decision.launch} in launch {k}'s file")
        return None
    return decision


def replace_nodes(record: Allocation, decision: Decision) -> dict[str, str] | None:
    """Apply a relaunch decision to the record: the decided nodes (those in the launch) are left
    out, as many spares take their places in rank order, the launch number moves on. Returns
    {left out: spare}, or None (record unchanged) when there are too few spares."""
    leave = [n for n in decision.leave_out if n in record.nodes]
    ignored = sorted(set(decision.leave_out) - set(leave))
    if ignored:
        log(f"decision names nodes not in launch {record.launch}: {ignored} (ignored)")
    if len(leave) > len(record.spares):
        return None
    taken, record.spares = record.spares[: len(leave)], record.spares[len(leave) :]
    swap = dict(zip(leave, taken, strict=True))
    record.nodes = [swap.get(n, n) for n in record.nodes]
    for node in leave:
        record.left_out[node] = decision.reason or "left out by the controller"
    record.launch += 1
    return swap
