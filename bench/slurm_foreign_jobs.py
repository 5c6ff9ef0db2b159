"""What one controller pass costs SLURM when the queue holds thousands of other people's jobs.

    python bench/slurm_foreign_jobs.py [--foreign 1000,10000] [--passes 15]   (root: runs daemons)

Brings up a real local SLURM cluster (orchestrator.slurm.local_cluster, Debian's slurm-wlm) in a
temporary directory on free ports, submits a run's jobs (one running, one waiting on it as a
singleton, one held), then measures a pass (`SlurmScheduler.jobs(ids)`, the one squeue the
controller makes) for one live id and for three, on the empty queue and again after adding held
foreign jobs (another user's, `sbatch --uid=nobody`, as on a shared cluster). For each: the
bytes squeue printed, the pass's wall time (median and max), and the CPU seconds slurmctld spent
per pass (/proc/<pid>/stat). Beside it, what the former query (`squeue --json`, every job
slurmctld knows, then filtered here) cost on the same queue, and the three ids asked with
`--user=root` (the owner: slurmctld packs only that user's jobs, but still walks them all).
Results: bench/results/slurm_foreign_jobs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.slurm.local_cluster import ClusterSpec, LocalCluster  # noqa: E402
from orchestrator.slurm.real import SlurmScheduler  # noqa: E402

RESULTS = REPO / "bench" / "results" / "slurm_foreign_jobs.json"


class CountingScheduler(SlurmScheduler):
    """SlurmScheduler that remembers how many bytes each squeue printed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.squeue_bytes: list[int] = []

    def _run(self, args, check=True, env=None):
        proc = super()._run(args, check=check, env=env)
        if args[0] == "squeue" and "--version" not in args:
            self.squeue_bytes.append(len(proc.stdout.encode()))
        return proc


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(pid: int, passes: int, one_pass) -> dict:
    """Median/max wall seconds, slurmctld CPU seconds per pass, bytes per pass."""
    one_pass()  # warm: the release is asked once
    walls, nbytes = [], []
    cpu_before = cpu_seconds(pid)
    for _ in range(passes):
        start = time.perf_counter()
        nbytes.append(one_pass())
        walls.append(time.perf_counter() - start)
    cpu = (cpu_seconds(pid) - cpu_before) / passes
    return {
        "bytes_per_pass": int(statistics.median(nbytes)),
        "seconds_median": round(statistics.median(walls), 4),
        "seconds_max": round(max(walls), 4),
        "slurmctld_cpu_seconds_per_pass": round(cpu, 4),
    }


def submit(env: dict, script: Path, *args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", *args, str(script)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--foreign", default="1000,10000", help="cumulative counts of held foreign jobs")
    parser.add_argument("--passes", type=int, default=15)
    args = parser.parse_args()
    steps = [int(n) for n in args.foreign.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-sq-", dir="/tmp"))
    cluster = LocalCluster(work / "c")
    spec = ClusterSpec(nodes=4, gpus_per_node=2, ctld_port=39017, slurmd_base_port=39101)
    cluster.up(spec, timeout=180)
    try:
        env = cluster.slurm_env()
        pid = int((cluster.dir / "run" / "slurmctld.pid").read_text().split()[0])
        long_job, short_job = work / "long.sh", work / "short.sh"
        long_job.write_text("#!/bin/bash\nsleep 3600\n")
        short_job.write_text("#!/bin/bash\ntrue\n")
        running = submit(env, long_job, "-J", "bench-run", "--dependency=singleton")
        waiting = submit(env, long_job, "-J", "bench-run", "--dependency=singleton")
        held = submit(env, short_job, "-J", "bench-run", "--hold")
        ours = [running, waiting, held]
        scheduler = CountingScheduler(env=env)
        deadline = time.time() + 60
        while scheduler.jobs([running])[running].state.value != "running" and time.time() < deadline:
            time.sleep(0.5)

        def our_pass(ids):
            def run() -> int:
                infos = scheduler.jobs(ids)
                assert all(infos[j].state.value != "unknown" for j in ids), infos
                return scheduler.squeue_bytes[-1]

            return run

        def raw_pass(*squeue_args: str):
            def run() -> int:
                proc = subprocess.run(
                    ["squeue", *squeue_args], env=env, capture_output=True, text=True, check=True
                )
                return len(proc.stdout.encode())

            return run

        rows = []
        total = 0
        for count in [0, *steps]:
            todo = count - total
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(
                    pool.map(
                        lambda k: submit(env, short_job, "-J", f"foreign-{k}", "--hold", "--uid=nobody"),
                        range(todo),
                    )
                )
            total = count
            row = {
                "foreign_held_jobs": count,
                "submit_seconds": round(time.perf_counter() - started, 1),
                "pass_one_live_job": measure(pid, args.passes, our_pass([running])),
                "pass_three_jobs": measure(pid, args.passes, our_pass(ours)),
                "three_jobs_with_user_filter": measure(
                    pid,
                    args.passes,
                    raw_pass("-h", "-t", "all", f"--jobs={','.join(ours)}", "--user=root", "-o", "%i"),
                ),
                "former_squeue_json_all_jobs": measure(pid, max(3, args.passes // 3), raw_pass("--json")),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
        release = scheduler.slurm_release()
        result = {
            "what": "one controller pass (SlurmScheduler.jobs) against a queue of held foreign jobs",
            "slurm_release": f"{release[0]}.{release[1]:02d}",
            "query": "squeue --noheader --states=all --jobs=IDS --Format=answers.SQUEUE_FORMAT",
            "machine": f"{platform.node()} {os.cpu_count()} cpus, shared",
            "passes_per_measure": args.passes,
            "rows": rows,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        RESULTS.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {RESULTS}")
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
