"""Start N local ranks of a Python module with the environment srun would give them (SLURM_PROCID,
SLURM_NTASKS, ...; MASTER_ADDR/PORT), wait for all, and fail with every rank's log tail if one fails.

Used by the 3D-parallel tests and bench/parallel_layouts.py. The per-rank environment is the
trainer tests' (tests/trainer/launch_local.rank_env); this starts any module (launch_local starts
`python -m trainer RUN_DIR`). One thread per rank: the machine that runs `make test` has 2 cores,
so 8 ranks oversubscribe it 4x already.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.trainer.launch_local import free_port, rank_env

REPO_ROOT = Path(__file__).resolve().parents[2]


class RanksFailed(RuntimeError):
    """A rank exited non-zero or the group timed out; the message carries each rank's log tail."""


def spawn_ranks(world: int, argv: list[str], log_dir: Path, *, timeout: float = 600.0,
                extra_env: dict[str, str] | None = None) -> float:
    """Run `python <argv>` as ranks 0..world-1; returns the wall time in seconds."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[tuple[subprocess.Popen, Path]] = []
    start = time.perf_counter()
    for rank in range(world):
        # srun's variables only (SLURM_PROCID, ...): trainer.launch derives RANK/WORLD_SIZE from them
        env = rank_env(rank, world, port, job_id="local-3d", extra={"PYTHONUNBUFFERED": "1", **(extra_env or {})})
        log = log_dir / f"rank-{rank:02d}.log"
        with open(log, "w") as handle:
            proc = subprocess.Popen([sys.executable, *argv], cwd=REPO_ROOT, env=env, stdout=handle,
                                    stderr=subprocess.STDOUT)
        procs.append((proc, log))
    deadline = start + timeout
    failed = []
    try:
        for rank, (proc, _) in enumerate(procs):
            try:
                code = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                code = "timeout"
            if code != 0:
                failed.append((rank, code))
                break  # the others would hang in a collective: stop them below
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if failed:
        tails = []
        for rank, (_, log) in enumerate(procs):
            lines = log.read_text(errors="replace").splitlines()
            tails.append(f"--- rank {rank} ({log}) ---\n" + "\n".join(lines[-25:]))
        raise RanksFailed(f"rank {failed[0][0]} of {world} ended with {failed[0][1]} running {' '.join(argv)}\n"
                          + "\n".join(tails))
    return time.perf_counter() - start
