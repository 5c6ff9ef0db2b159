"""Start `python -m trainer RUN_DIR` as N local ranks with SLURM-like variables (tests only).

    procs = launch_local.start(run_dir, nranks=2, env={"TRAINER_MAX_STEPS": "4"})
    codes = launch_local.wait(procs, timeout=120)

Each rank gets SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NNODES / SLURM_JOB_ID and
MASTER_ADDR=127.0.0.1 + a free MASTER_PORT, as the sbatch script would export them, so the code
path is the one srun takes. One thread per rank (OMP_NUM_THREADS=1): the CI machine has 2 cores.
Output goes to RUN_DIR/logs/rank-N.log. Reused by the 3D-parallel tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, nranks: int, port: int, job_id: str = "local-test", nnodes: int = 1,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    per_node = max(1, nranks // nnodes)
    env.update({
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(nranks),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NODEID": str(rank // per_node),
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_ID": job_id,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TRAINER_TENSORBOARD": env.get("TRAINER_TENSORBOARD", "0"),
        "PYTHONPATH": str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    if nnodes > 1:  # emulated nodes on one host: SLURM's node name tells their heartbeat files apart
        env["SLURMD_NODENAME"] = f"localnode{rank // per_node}"
    env.update(extra or {})
    return env


def start(run_dir: Path, nranks: int = 1, env: dict[str, str] | None = None, job_id: str = "local-test",
          nnodes: int = 1, rank_extra: dict[int, dict[str, str]] | None = None,
          module: str = "trainer", args: tuple[str, ...] = (),
          standby_go: Path | None = None) -> list[subprocess.Popen]:
    """`python -m MODULE RUN_DIR ARGS...` (the trainer, or e.g. trainer.replay) as `nranks` ranks;
    with `standby_go`, `python -m trainer.standby --go FILE -- python -m trainer RUN_DIR`: warm
    standby tasks that become ranks once the test writes the go file (its layout, not these ranks')."""
    run_dir = Path(run_dir)
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for rank in range(nranks):
        extra = {**(env or {}), **((rank_extra or {}).get(rank, {}))}
        log = open(logs / f"rank-{rank}.log", "ab")  # noqa: SIM115 (closed by wait())
        argv = [sys.executable, "-m", module, str(run_dir), *args]
        if standby_go is not None:
            argv = [sys.executable, "-m", "trainer.standby", "--go", str(standby_go), "--", *argv]
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
            env=rank_env(rank, nranks, port, job_id, nnodes, extra), start_new_session=True,
        )
        proc.log_file = log  # type: ignore[attr-defined]
        procs.append(proc)
    return procs


def wait(procs: list[subprocess.Popen], timeout: float = 300) -> list[int]:
    """Exit codes of every rank; on timeout every rank is killed and TimeoutError says which hung."""
    deadline = time.time() + timeout
    codes: list[int | None] = [None] * len(procs)
    while time.time() < deadline and any(c is None for c in codes):
        for i, proc in enumerate(procs):
            if codes[i] is None:
                codes[i] = proc.poll()
        time.sleep(0.2)
    hung = [i for i, c in enumerate(codes) if c is None]
    for i in hung:
        os.killpg(procs[i].pid, signal.SIGKILL)
        procs[i].wait()
    for proc in procs:
        proc.log_file.close()  # type: ignore[attr-defined]
    if hung:
        raise TimeoutError(f"ranks {hung} still running after {timeout:.0f}s (killed); see logs/rank-N.log")
    return [int(c) for c in codes]  # type: ignore[arg-type]


def run(run_dir: Path, nranks: int = 1, env: dict[str, str] | None = None, timeout: float = 300,
        **kwargs) -> list[int]:
    return wait(start(run_dir, nranks, env, **kwargs), timeout)


def read_log(run_dir: Path, rank: int = 0) -> str:
    return (Path(run_dir) / "logs" / f"rank-{rank}.log").read_text(errors="replace")
