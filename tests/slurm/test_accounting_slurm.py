"""Accounting for real: jobs that ended while no controller ran, read back from a real `sacct`.

The host's 22.05 with a slurmdbd and MariaDB of its own (`accounted_cluster`). Three jobs end
(exit 3, success, cancelled while running); then slurmctld restarts with its state cleared, as
after MinJobAge, so squeue has forgotten them all. A controller that starts now asks
`SlurmScheduler.jobs` and must get each job's true state, exit code and node from sacct, never
UNKNOWN. (24.11's slurmdbd cannot run against Debian 13's MariaDB: see orchestrator/slurm/local_cluster/
accounting.py; the sacct reader is the same text format on both releases.)
"""

from __future__ import annotations

import time

import pytest

from orchestrator.slurm.base import JobState

pytestmark = [pytest.mark.slurm]


def _submit(cluster, *words: str) -> str:
    proc = cluster.run_slurm(["sbatch", "--parsable", "--nodes=1", "--output=/dev/null", *words])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def test_jobs_that_ended_unwatched_are_read_from_sacct_with_their_true_end(accounted_cluster):
    from orchestrator.slurm.real import SlurmScheduler

    cluster = accounted_cluster
    failed = _submit(cluster, "--job-name=exits3", "--wrap=exit 3")
    ok = _submit(cluster, "--job-name=succeeds", "--wrap=true")
    cancelled = _submit(cluster, "--job-name=cancelled", "--wrap=sleep 120")
    ids = [failed, ok, cancelled]
    deadline = time.time() + 30
    while time.time() < deadline:
        running = cluster.run_slurm(["squeue", "-h", "-t", "R", "-j", cancelled, "-o", "%i"]).stdout.split()
        ended = cluster.run_slurm(["squeue", "-h", "-t", "CD,F", "-j", f"{failed},{ok}", "-o", "%i"]).stdout.split()
        if running and len(ended) == 2:
            break
        time.sleep(0.5)
    assert cluster.run_slurm(["scancel", cancelled]).returncode == 0
    time.sleep(2.0)  # slurmctld sends the end records to slurmdbd

    # slurmctld restarts with its job state cleared (-c): squeue knows none of them now.
    spec = cluster.status_spec()
    cluster.down()
    cluster.up(spec, timeout=120)
    forgotten = cluster.run_slurm(["squeue", "-h", "--states=all", "-o", "%i"]).stdout.split()
    assert not set(ids) & set(forgotten), forgotten

    jobs = SlurmScheduler(env=cluster.slurm_env()).jobs(ids)
    seen = {j: (info.state, info.exit_code, info.signal, info.nodes, info.name) for j, info in jobs.items()}
    print(f"read from sacct after slurmctld forgot them: {seen}")
    assert seen[failed][:2] == (JobState.FAILED, 3) and seen[failed][4] == "exits3", seen
    assert seen[ok][:2] == (JobState.COMPLETED, 0), seen
    assert seen[cancelled][0] == JobState.CANCELLED, seen
    assert all(len(info.nodes) == 1 and info.nodes[0].startswith("node") for info in jobs.values()), seen


def test_an_up_that_fails_at_accounting_leaves_no_daemon(tmp_path_factory, monkeypatch):
    """`up` records its pids once slurmctld runs; accounting starts before it, after munged."""
    import os
    import subprocess

    from orchestrator.slurm import accounting
    from orchestrator.slurm.local_cluster import ClusterError, ClusterSpec
    from tests.fixtures_slurm import _free_port_base

    if os.geteuid() != 0:
        pytest.skip("starts munged as root")

    def missing() -> None:
        raise ClusterError("accounting packages missing (test)")

    monkeypatch.setattr(accounting, "_install_accounting", missing)
    folder = tmp_path_factory.mktemp("acct-fail", numbered=True)
    ctld, slurmd = _free_port_base(1)
    with pytest.raises(ClusterError, match="missing"):
        accounting.AccountedCluster(folder).up(ClusterSpec(nodes=1, gpus_per_node=0, ctld_port=ctld, slurmd_base_port=slurmd))
    left = subprocess.run(["pgrep", "-f", "--", f"--socket={folder}/"], capture_output=True, text=True).stdout.split()
    assert not left, f"daemons of the failed up still run: {left}"
