"""`python -m trainer.in_allocation`: the batch script's program when the job has spare nodes.

    trainer.in_allocation --run-dir R --job-dir J --nodes N --tasks-per-node G --cpus-per-task C
        --srun-wait W --decision-seconds D [--health --health-seconds H] -- <trainer command>

It runs once per job, on the batch host, and never imports torch (it starts in a blink):
1. the health check (`trainer.health`, one task per allocated node, if enabled): nodes that fail
   it, or do not answer within H s, are never used; allocation.json says why;
2. launch 0: the trainer as an srun step on the first N healthy nodes; the rest are spares;
3. when a launch fails it waits (at most D s) for the controller's decision
   (orchestrator/allocation.py): `relaunch` leaves out the named nodes and starts launch K+1 on
   spares at once, in this allocation (no queue wait); no decision, or too few spares: exit
   with the launch's exit code (or the controller cancels the job), and the restart is at job level
   as without spares.
   A decision that arrives while a launch still runs (the controller saw a hang) kills that
   launch's step first.
The launcher decides nothing itself: which node failed is the controller's call, on evidence in
the run directory (this launch's srun stderr, the heartbeats).

Exit code: the trainer's (0 finished, 17 killed, 18 time budget, 19 config error, else a failure;
the first task srun reports decides, as in the plain job script), or 20 when fewer than N nodes
passed the health check.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.allocation import (
    Allocation,
    ContractError,
    Decision,
    read_decision,
    read_owned_json,
    write_allocation,
    write_owner_json,
)
from orchestrator.protocol import ExitCode, RunPaths
from trainer.launch import node_address, slurm_hostnames
from trainer.standby import ready_dir

# Exits that are the trainer's own decision: never a reason to relaunch.
PURPOSEFUL = frozenset({ExitCode.FINISHED, ExitCode.KILLED, ExitCode.TIME_BUDGET, ExitCode.CONFIG_ERROR})
POLL_SECONDS = 0.5
TASK_LINE = re.compile(r"task [0-9]+: .*")
TASK_EXIT = re.compile(r"task [0-9]+: Exited with exit code ([0-9]+)")
# srun's own variables from the batch step describe the whole allocation (spares included); each
# launch says its own layout on the command line instead.
ALLOCATION_WIDE = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_TASKS_PER_NODE", "SLURM_NODELIST")


def log(message: str) -> None:
    print(f"runctl launcher: {message}; {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)


def master_address(node: str) -> str:
    """trainer.launch.node_address, or a message that says what to fix."""
    try:
        return node_address(node)
    except OSError:
        raise SystemExit(
            f"runctl launcher: cannot resolve {node} (its NodeAddr) to an address: fix DNS, /etc/hosts "
            "or NodeAddr in slurm.conf"
        ) from None


def first_exit_code(stderr_text: str) -> int | None:
    """The exit code of the first task srun reports, when that task exited with a code: with
    --kill-on-bad-exit the others are SIGTERMed after it, and srun's own code would be theirs
    (143). A first task killed by a signal: None (srun's own code stands, a failure). The same
    rule as the plain job script (docs/slurm.md)."""
    first = TASK_LINE.search(stderr_text)
    found = TASK_EXIT.match(first.group(0)) if first else None
    return int(found.group(1)) if found else None


class Launcher:
    def __init__(self, args: argparse.Namespace, command: list[str], env: dict[str, str] | None = None):
        self.args = args
        self.command = command
        self.env = dict(os.environ if env is None else env)
        self.job_id = self.env["SLURM_JOB_ID"]
        self.paths = RunPaths.of(args.run_dir)
        self.job_dir = Path(args.job_dir)
        self.record: Allocation | None = None
        self.standby: Step | None = None

    # The whole job ----------------------------------------------------------------------------
    def run(self) -> int:
        allocated = slurm_hostnames(self.env["SLURM_JOB_NODELIST"])
        self.record = Allocation(self.job_id, "health_check", 0, [], list(allocated))
        self._save()
        healthy, unhealthy, problem = self._health(allocated) if self.args.health else (allocated, {}, "")
        record = self.record
        record.unhealthy = unhealthy
        need = self.args.nodes
        if problem:
            return self._end(int(ExitCode.UNHEALTHY_NODES), f"the allocation failed its health check as a whole: {problem}")
        if len(healthy) < need:
            return self._end(
                int(ExitCode.UNHEALTHY_NODES),
                f"{len(healthy)} healthy nodes of {len(allocated)}, the run needs {need}: "
                + "; ".join(f"{n}: {why}" for n, why in unhealthy.items()),
            )
        record.nodes, record.spares = healthy[:need], healthy[need:]
        while True:
            code = self._launch()
            if code in PURPOSEFUL:
                return self._end(code, f"launch {record.launch} ended: {ExitCode.describe(code)}")
            decision = self._await_decision(code)
            if decision is None:
                return self._end(code, "no decision from the controller: the job ends (job-level restart)")
            if not self._replace(decision):
                return self._end(code, f"{len(record.spares)} spare(s) left, {len(decision.leave_out)} needed")

    def _end(self, code: int, note: str) -> int:
        assert self.record is not None
        self._drop_standby()
        self.record.state, self.record.exit_code, self.record.note = "ended", code, note
        self._save()
        log(f"{note}; exit code {code}")
        return code

    def _save(self) -> None:
        assert self.record is not None
        write_allocation(self.paths.allocation(self.job_id), self.record)

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
        argv = [
            "srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=0", "--job-name=health-check",
            sys.executable, "-m", "trainer.health", "--run-dir", str(self.paths.root), "--job-dir", str(self.job_dir),
        ]
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=self._step_env({}))
        try:
            proc.wait(timeout=self.args.health_seconds + 15)  # the checker itself gives up at 0.95 x
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
            try:
                data = read_owned_json(results / f"{node}.json")
            except ContractError as exc:
                data = {"ok": False, "reason": f"its health result cannot be trusted: {exc}"}
            if not isinstance(data, dict):
                data = {"ok": False, "reason": f"no health result within {self.args.health_seconds:.0f} s"}
            ok, reason = data.get("ok") is True, str(data.get("reason") or "failed the health check")
            if data.get("allocation_problem"):
                problems.add(str(data["allocation_problem"])[:300])
            if ok:
                healthy.append(node)
            else:
                unhealthy[node] = reason[:300]
        log(f"health check of {len(nodes)} nodes in {time.monotonic() - started:.1f} s: "
            f"{len(healthy)} healthy" + (f", unhealthy: {unhealthy}" if unhealthy else "")
            + (f"; allocation problem: {'; '.join(sorted(problems))}" if problems else ""))
        return healthy, unhealthy, "; ".join(sorted(problems))

    # Launches -----------------------------------------------------------------------------
    def _step_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self.env.items() if k not in ALLOCATION_WIDE}
        env.update(extra)
        return env

    def _launch(self) -> int:
        """Run launch K on its nodes: the warm standby step when it covers them, else a new srun
        step. A decision for K that arrives meanwhile kills its step; once K trains, the standby
        for K+1 is started."""
        record = self.record
        assert record is not None
        k, nodes = record.launch, record.nodes
        g = self.args.tasks_per_node
        port = 10000 + (int(self.job_id) * 16 + k) % 20000  # a fresh port per launch
        master = master_address(nodes[0])
        record.state, record.exit_code, record.standby_ready = "running", None, False
        self._save()
        warm = self.standby is not None and self.standby.launch == k and self.standby.covers(nodes)
        if warm:
            launch = self.standby
            self.standby = None
            launch.stderr_path = self.paths.launch_stderr(self.job_id, k)
            write_owner_json(
                self._go_file(k),
                {"version": 1, "launch": k, "nodes": nodes, "tasks_per_node": g, "master_addr": master,
                 "master_port": port},
            )
        else:
            self._drop_standby()
            env = self._step_env({"MASTER_ADDR": master, "MASTER_PORT": str(port), "RUNCTL_LAUNCH": str(k)})
            argv = [
                "srun", "--kill-on-bad-exit=1", f"--wait={self.args.srun_wait}", f"--job-name=launch-{k}",
                f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * g}", f"--ntasks-per-node={g}",
                f"--cpus-per-task={self.args.cpus_per_task}", f"--nodelist={','.join(nodes)}", *self.command,
            ]
            launch = Step.start(argv, env, f"launch-{k}", k, nodes, self.paths.launch_stderr(self.job_id, k))
        log(f"launch {k} on {','.join(nodes)} ({'warm standby' if warm else 'cold start'}; spares: "
            f"{','.join(record.spares) or 'none'}); MASTER_ADDR={master} MASTER_PORT={port}")
        killed = False
        while launch.proc.poll() is None:
            if not killed and self._decision(k) is not None:
                log(f"the controller decided about launch {k} while it runs: killing its step")
                killed = self._kill_step(launch.name)
            if self.standby is None and self.warm_standby and self._training(k):
                self._start_standby(k + 1)
            self._note_standby_ready()
            time.sleep(POLL_SECONDS)
        code = launch.finish()
        record.exit_code = code
        log(f"launch {k} ended with exit code {code}")
        return code

    # The warm standby (trainer/standby.py) ------------------------------------------------------
    @property
    def warm_standby(self) -> bool:
        """Only the trainer itself can be kept warm (tests launch other programs)."""
        return self.command[1:3] == ["-m", "trainer"] and len(self.command) == 4

    def _go_file(self, launch: int) -> Path:
        return self.job_dir / f"standby-{launch}.go.json"

    def _training(self, launch: int) -> bool:
        """Rank 0 of this launch reached its first step (the standby's imports would slow its init)."""
        try:
            beat = read_owned_json(self.paths.heartbeat(0))
        except ContractError:
            return False
        return (
            isinstance(beat, dict)
            and str(beat.get("job_id")) == self.job_id
            and beat.get("launch", 0) == launch
            and beat.get("phase") == "step"
        )

    def _start_standby(self, launch: int) -> None:
        record = self.record
        assert record is not None
        nodes = record.nodes + record.spares
        g = self.args.tasks_per_node
        argv = [
            "srun", "--overlap", "--kill-on-bad-exit=1", "--wait=0", f"--job-name=standby-{launch}",
            f"--nodes={len(nodes)}", f"--ntasks={len(nodes) * g}", f"--ntasks-per-node={g}",
            f"--cpus-per-task={self.args.cpus_per_task}", f"--nodelist={','.join(nodes)}",
            self.command[0], "-m", "trainer.standby", "--go", str(self._go_file(launch)), "--", *self.command,
        ]
        self.standby = Step.start(
            argv, self._step_env({}), f"standby-{launch}", launch, nodes, self.job_dir / f"standby-{launch}.srun.stderr"
        )
        log(f"standby for launch {launch} warming up on {','.join(nodes)}")

    def _note_standby_ready(self) -> None:
        """allocation.json says when every standby task is warm (for people, tests, benchmarks)."""
        record, standby = self.record, self.standby
        if record is None or standby is None or record.standby_ready:
            return
        ready = ready_dir(self._go_file(standby.launch))
        tasks = len(standby.nodes) * self.args.tasks_per_node
        if ready.is_dir() and len(os.listdir(ready)) >= tasks:
            record.standby_ready = True
            self._save()
            log(f"standby for launch {standby.launch} is warm ({tasks} tasks)")

    def _drop_standby(self) -> None:
        if self.standby is not None:
            if self.standby.proc.poll() is None:
                self._kill_step(self.standby.name)
            self.standby.finish(timeout=30)
            self.standby = None

    def _kill_step(self, name: str) -> bool:
        """SIGKILL the running step named `name` (a hung rank ignores SIGTERM; a stopped one too)."""
        listed = subprocess.run(
            ["squeue", "--steps", f"--jobs={self.job_id}", "--noheader", "--format=%i %j"],
            capture_output=True, text=True, check=False,
        )
        for line in listed.stdout.splitlines():
            step, _, step_name = line.strip().partition(" ")
            if step_name.strip() == name:
                subprocess.run(["scancel", "--signal=KILL", step], check=False)
                return True
        return False

    def _decision(self, k: int) -> Decision | None:
        try:
            decision = read_decision(self.paths.launch_decision(self.job_id, k))
        except ContractError as exc:
            log(f"ignoring the decision file for launch {k}: {exc}")
            return None
        if decision is not None and decision.launch != k:
            log(f"ignoring a decision for launch {decision.launch} in launch {k}'s file")
            return None
        return decision

    def _await_decision(self, code: int) -> Decision | None:
        record = self.record
        assert record is not None
        decision = self._decision(record.launch)
        if decision is not None or self.args.decision_seconds <= 0:
            return decision
        record.state = "waiting_decision"
        self._save()
        log(f"launch {record.launch} failed (exit code {code}): waiting up to "
            f"{self.args.decision_seconds:.0f} s for the controller's decision")
        deadline = time.monotonic() + self.args.decision_seconds
        while time.monotonic() < deadline:
            decision = self._decision(record.launch)
            if decision is not None:
                return decision
            time.sleep(POLL_SECONDS)
        return None

    def _replace(self, decision: Decision) -> bool:
        """Leave out the decided nodes, take as many spares; False when there are not enough."""
        record = self.record
        assert record is not None
        leave = [n for n in decision.leave_out if n in record.nodes]
        ignored = sorted(set(decision.leave_out) - set(leave))
        if ignored:
            log(f"decision names nodes not in launch {record.launch}: {ignored} (ignored)")
        if len(leave) > len(record.spares):
            return False
        taken, record.spares = record.spares[: len(leave)], record.spares[len(leave) :]
        swap = dict(zip(leave, taken, strict=True))
        record.nodes = [swap.get(n, n) for n in record.nodes]
        for node in leave:
            record.left_out[node] = decision.reason or "left out by the controller"
        record.launch += 1
        log(f"relaunching as launch {record.launch}: " + (
            ", ".join(f"{a} -> {b}" for a, b in swap.items()) or "on the same nodes"))
        return True


@dataclass
class Step:
    """One srun step of the launcher: a launch, or the standby that may become one."""

    proc: subprocess.Popen
    name: str
    launch: int
    nodes: list[str]
    stderr_path: Path
    copier: threading.Thread

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], name: str, launch: int, nodes: list[str], stderr_path: Path) -> Step:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        step = cls(proc, name, launch, list(nodes), stderr_path, threading.Thread())
        step.copier = threading.Thread(target=step._tee, daemon=True)
        step.copier.start()
        return step

    def _tee(self) -> None:
        """srun's stderr to the job output (as without the launcher) and to `stderr_path`, which
        moves from the standby's file to the launch's when the standby becomes one."""
        path, copy = None, None
        try:
            for line in iter(self.proc.stderr.readline, b""):
                sys.stderr.buffer.write(line)
                sys.stderr.buffer.flush()
                if path != self.stderr_path:
                    if copy is not None:
                        copy.close()
                    path = self.stderr_path
                    copy = open(path, "ab")  # noqa: SIM115 - reopened when the path moves
                copy.write(line)
                copy.flush()
        finally:
            if copy is not None:
                copy.close()

    def covers(self, nodes: list[str]) -> bool:
        return self.proc.poll() is None and set(nodes) <= set(self.nodes)

    def finish(self, timeout: float | None = None) -> int:
        """Its exit code: the first task srun reports as exited with a code, else srun's own."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.copier.join(timeout=10)
        code = self.proc.returncode
        if code != 0:
            text = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
            told = first_exit_code(text)
            code = told if told is not None else code
        return code


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("trainer.in_allocation: the trainer command follows `--`")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m trainer.in_allocation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--tasks-per-node", type=int, required=True)
    parser.add_argument("--cpus-per-task", type=int, required=True)
    parser.add_argument("--srun-wait", type=int, default=60)
    parser.add_argument("--decision-seconds", type=float, default=120.0)
    parser.add_argument("--health", action="store_true")
    parser.add_argument("--health-seconds", type=float, default=300.0)
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        raise SystemExit("trainer.in_allocation: no trainer command after `--`")
    return args, command


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    return Launcher(args, command).run()


if __name__ == "__main__":
    sys.exit(main())
