"""Execute mode of the mocked SLURM: batch scripts really run on this machine. NOT SLURM.

`spawn_runner` starts one detached runner per submitted job (`python -m orchestrator.slurm.mock_cli
run-job ID`). The runner waits while the job is held or its singleton dependency is unfulfilled,
then runs the script with bash in its own process group and SLURM's job variables, writes the
output where #SBATCH --output says, enforces --time (with the --signal warning) and records the
end state (COMPLETED / FAILED / CANCELLED / TIMEOUT) and the exit code.

`srun_main` is the `srun` shim: it starts nodes x ntasks-per-node local processes with
SLURM_PROCID/SLURM_LOCALID/SLURM_NODEID/SLURM_NTASKS/SLURM_JOB_NODELIST/SLURM_NNODES/SLURM_JOB_ID
set, forwards signals to them, implements --kill-on-bad-exit, --wait and --label (each line of a
task's stdout and stderr prefixed with its task number, right-aligned to the width of the largest,
as SLURM's `%*d: `), and exits with the highest task exit code (as srun does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .hostlist import expand_hostlist
from .mock_core import (
    KILL_WAIT_SECONDS,
    NOT_SLURM,
    REPO_ROOT,
    TERMINAL,
    MockSlurm,
    parse_time_limit,
    write_shims,
)


class ExecutingMockSlurm(MockSlurm):
    """MockSlurm whose submit and cancel also start and signal the job's processes when its state
    directory is in execute mode; in scenario mode it behaves exactly as MockSlurm."""

    def submit(self, options: dict[str, str], script_path: str, cwd: str | None = None) -> str:
        job_id = super().submit(options, script_path, cwd)
        if self.execute:
            spawn_runner(self, job_id)
        return job_id

    def cancel(self, job_ids: list[str], signal: str | None = None) -> list[tuple[dict[str, Any], str]]:
        to_signal = super().cancel(job_ids, signal)
        if self.execute:
            for job, sig in to_signal:
                deliver_signal(self, job, sig)
        return to_signal


def _env_for_tools(slurm: MockSlurm) -> dict[str, str]:
    env = dict(os.environ)
    env["RUNCTL_MOCK_SLURM_DIR"] = str(slurm.dir)
    env["PYTHONPATH"] = str(REPO_ROOT) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not (slurm.shim_dir / "srun").exists():
        write_shims(slurm.shim_dir, slurm.dir)
    env["PATH"] = f"{slurm.shim_dir}:{env.get('PATH', '')}"
    return env


def spawn_runner(slurm: MockSlurm, job_id: str) -> None:
    log = open(slurm.dir / f"runner-{job_id}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.slurm.mock_cli", "run-job", job_id],
            env=_env_for_tools(slurm), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()
    with slurm.locked() as state:
        state["jobs"][job_id]["runner_pid"] = proc.pid


def deliver_signal(slurm: MockSlurm, job: dict[str, Any], sig: str) -> None:
    """scancel: TERM to the whole job (the runner escalates to KILL); any other signal to the
    job's srun step only (like SLURM without --batch/--full), which forwards it to every task."""
    signum = getattr(signal, sig if sig.startswith("SIG") else f"SIG{sig}")
    target = job.get("srun_pid") if sig not in ("TERM", "KILL") else job.get("pgid")
    if target:
        try:
            if sig in ("TERM", "KILL"):
                os.killpg(int(target), signum)
            else:
                os.kill(int(target), signum)
        except ProcessLookupError:
            pass


def _output_path(job: dict[str, Any], key: str) -> Path:
    pattern = (
        job["options"].get(key) or job["options"].get("output") or str(Path(job["cwd"]) / "slurm-%j.out")
    )
    return Path(pattern.replace("%j", job["job_id"]).replace("%x", job["name"]))


def _finish(slurm: MockSlurm, job_id: str, slurm_state: str, raw_exit: int) -> None:
    with slurm.locked() as state:
        job = state["jobs"][job_id]
        if job["state"] not in TERMINAL:
            job["state"], job["raw_exit"], job["end_time"] = slurm_state, raw_exit, time.time()
            job["reason"] = "NonZeroExitCode" if slurm_state == "FAILED" else "None"


def run_job(slurm: MockSlurm, job_id: str) -> int:
    # Wait for our turn (held, singleton) or for a cancel.
    while True:
        with slurm.locked() as state:
            job = state["jobs"][job_id]
            if job["state"] in TERMINAL:
                return 0
            if job["held"]:
                job["reason"] = "JobHeldUser"
            elif slurm._singleton_blocked(state, job):
                job["reason"] = "Dependency"
            else:
                job["state"], job["reason"], job["start_time"] = "RUNNING", "None", time.time()
                break
        time.sleep(0.2)
    job = slurm.job(job_id)
    out_path, err_path = _output_path(job, "output"), _output_path(job, "error")
    try:
        out = open(out_path, "ab")  # noqa: SIM115
        err = out if err_path == out_path else open(err_path, "ab")  # noqa: SIM115
    except OSError as exc:  # SLURM fails such a job too: it does not create the folder
        print(f"{NOT_SLURM}: cannot open the job output {out_path}: {exc}", file=sys.stderr)
        _finish(slurm, job_id, "FAILED", 1 << 8)
        return 1
    env = _env_for_tools(slurm)
    nodes = expand_hostlist(job["nodelist"])
    opts = job["options"]
    env.update(
        SLURM_JOB_ID=job_id, SLURM_JOBID=job_id, SLURM_JOB_NAME=job["name"], SLURM_JOB_NODELIST=job["nodelist"],
        SLURM_NODELIST=job["nodelist"], SLURM_NNODES=str(len(nodes)), SLURM_JOB_NUM_NODES=str(len(nodes)),
        SLURM_NTASKS_PER_NODE=opts.get("ntasks-per-node", "1"), SLURM_CPUS_PER_TASK=opts.get("cpus-per-task", "1"),
        SLURM_SUBMIT_DIR=job["cwd"], SLURM_CLUSTER_NAME="mock", SLURMD_NODENAME=nodes[0], RUNCTL_MOCK_SLURM="1",
    )  # fmt: skip
    out.write(
        f"{NOT_SLURM}: running job {job_id} ({job['name']}) on this machine as {len(nodes)} mock nodes\n".encode()
    )
    out.flush()
    proc = subprocess.Popen(
        ["bash", job["script"]], cwd=job["cwd"], env=env, stdout=out, stderr=err, start_new_session=True
    )
    with slurm.locked() as state:
        state["jobs"][job_id]["pgid"] = proc.pid
    limit = parse_time_limit(opts.get("time"))
    warn_sig, warn_at = None, None
    if opts.get("signal") and limit:
        spec = opts["signal"].split(":")[-1]  # [B:]SIG[@seconds]
        name, _, secs = spec.partition("@")
        warn_sig, warn_at = name, limit - float(secs or 60)
    started, term_sent, warned = time.time(), None, False
    while proc.poll() is None:
        time.sleep(0.1)
        elapsed = time.time() - started
        current = slurm.job(job_id)
        if warn_at is not None and not warned and elapsed >= warn_at:
            warned = True
            deliver_signal(slurm, current, warn_sig or "USR1")
        if limit is not None and elapsed >= limit and current["state"] == "RUNNING":
            _finish(slurm, job_id, "TIMEOUT", 0)
            current = slurm.job(job_id)
        if current["state"] in TERMINAL and term_sent is None:  # cancelled or timed out
            term_sent = time.time()
            os.killpg(proc.pid, signal.SIGTERM)
        if term_sent is not None and time.time() - term_sent > KILL_WAIT_SECONDS:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    code = proc.returncode
    raw = (-code & 0x7F) if code < 0 else (code & 0xFF) << 8
    _finish(slurm, job_id, "COMPLETED" if code == 0 else "FAILED", raw)
    return 0


def _parse_srun(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    short = {"N": "nodes", "n": "ntasks", "c": "cpus-per-task", "K": "kill-on-bad-exit", "W": "wait"}
    flags = {"kill-on-bad-exit", "label", "exclusive", "overlap"}
    options: dict[str, str] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return options, argv[i + 1 :]
        if tok.startswith("--"):
            key, eq, value = tok[2:].partition("=")
            if not eq and key not in flags:
                i += 1
                value = argv[i]
            options[key] = value or "1"
        elif tok.startswith("-") and len(tok) >= 2 and tok[1] in short:
            key = short[tok[1]]
            value = tok[2:]
            if not value and key not in flags:
                i += 1
                value = argv[i]
            options[key] = value or "1"
        else:
            return options, argv[i:]
        i += 1
    return options, []


_OUTPUT_LOCK = threading.Lock()


def _relay(stream: Any, prefix: bytes) -> None:
    """One task's output, line by line, labelled, onto srun's stdout (whole lines: never two tasks'
    bytes within one line)."""
    for raw in iter(stream.readline, b""):
        with _OUTPUT_LOCK:
            sys.stdout.buffer.write(prefix + (raw if raw.endswith(b"\n") else raw + b"\n"))
            sys.stdout.buffer.flush()
    stream.close()


def srun_main(argv: list[str]) -> int:
    options, command = _parse_srun(argv)
    if not command:
        print("mock-slurm srun: give a command", file=sys.stderr)
        return 2
    nodelist = expand_hostlist(os.environ.get("SLURM_JOB_NODELIST", "node01"))
    num_nodes = int(options.get("nodes", os.environ.get("SLURM_NNODES", len(nodelist))))
    per_node = int(options.get("ntasks-per-node", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    ntasks = int(options.get("ntasks", num_nodes * per_node))
    per_node = max(1, -(-ntasks // num_nodes))
    nodes = nodelist[:num_nodes]
    print(
        f"{NOT_SLURM}: srun starts {ntasks} local processes as {num_nodes} nodes ({','.join(nodes)})",
        file=sys.stderr,
    )
    procs = []
    label = options.get("label", "0") not in ("0", "")
    relays: list[threading.Thread] = []
    for rank in range(ntasks):
        node_id = rank // per_node
        env = dict(os.environ)
        env.update(
            SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node), SLURM_NODEID=str(node_id),
            SLURMD_NODENAME=nodes[node_id], SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks),
            SLURM_NNODES=str(num_nodes), SLURM_STEP_NUM_TASKS=str(ntasks), SLURM_STEP_NUM_NODES=str(num_nodes),
            SLURM_STEP_NODELIST=os.environ.get("SLURM_JOB_NODELIST", "node01"), SLURM_STEP_ID="0",
            SLURM_TASKS_PER_NODE=f"{per_node}(x{num_nodes})",
            SLURM_CPUS_PER_TASK=options.get("cpus-per-task", os.environ.get("SLURM_CPUS_PER_TASK", "1")),
        )  # fmt: skip
        if not label:
            procs.append(subprocess.Popen(command, env=env))
            continue
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(proc)
        prefix = f"{rank:>{len(str(ntasks - 1))}}: ".encode()
        relays.append(threading.Thread(target=_relay, args=(proc.stdout, prefix), daemon=True))
        relays[-1].start()
    slurm_dir = os.environ.get("RUNCTL_MOCK_SLURM_DIR")
    job_id = os.environ.get("SLURM_JOB_ID")
    if slurm_dir and job_id:
        slurm = MockSlurm(slurm_dir)
        with slurm.locked() as state:
            if job_id in state["jobs"]:
                state["jobs"][job_id]["srun_pid"] = os.getpid()

    def forward(signum: int, _frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    kill_on_bad = options.get("kill-on-bad-exit", "0") not in ("0", "")
    wait = float(options["wait"]) if "wait" in options else None
    killed_by_us: set[int] = set()
    first_exit, term_at = None, None
    end_times: dict[int, float] = {}
    while any(p.poll() is None for p in procs):
        time.sleep(0.05)
        codes = [p.poll() for p in procs]
        for k, c in enumerate(codes):
            if c is not None and k not in end_times:
                end_times[k] = time.time()
        done = [c for c in codes if c is not None]
        if done and first_exit is None:
            first_exit = time.time()
        bad = any(c != 0 for i, c in enumerate(codes) if c is not None and i not in killed_by_us)
        overdue = wait is not None and wait > 0 and first_exit is not None and time.time() - first_exit > wait
        if ((kill_on_bad and bad) or overdue) and term_at is None:
            term_at = time.time()
            for i, p in enumerate(procs):
                if p.poll() is None:
                    killed_by_us.add(i)
                    p.terminate()
        if term_at is not None and time.time() - term_at > KILL_WAIT_SECONDS:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    for relay in relays:  # every task's last lines are out before srun's own account
        relay.join(timeout=5.0)
    # srun's own account of each task that did not exit 0 (the batch script and the controller
    # read these lines: the first one decides the job's exit code).
    for i in sorted(range(len(procs)), key=lambda k: end_times.get(k, 0.0)):
        code, node = procs[i].returncode, nodes[i // per_node]
        if code > 0:
            print(f"srun: error: {node}: task {i}: Exited with exit code {code}", file=sys.stderr, flush=True)
        elif code < 0:
            what = {signal.SIGTERM: "Terminated", signal.SIGKILL: "Killed"}.get(-code, f"Signal {-code}")
            print(f"srun: error: {node}: task {i}: {what}", file=sys.stderr, flush=True)
    codes = []
    for i, p in enumerate(procs):
        code = p.returncode
        if i in killed_by_us and code < 0:
            continue
        codes.append(128 - code if code < 0 else code)
    return max(codes) if codes else 1
