"""On a real SLURM cluster of 4 emulated nodes (Debian slurm-wlm, brought up once per session by
the `local_cluster` fixture): the rendered job script runs across the nodes, chains are serial,
cancel stops a chain."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.contract import RunPaths
from orchestrator.operate.runs import JobRow, cancel_run, job_table, submit_run

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo-cpu-4node.yaml"  # 4 nodes x 1 GPU, one rank per node

# Every rank reports itself; then rank 0 listens on MASTER_ADDR:MASTER_PORT and the others
# connect to it: the address resolves and is reachable from every node, as torch's rendezvous needs.
RENDEZVOUS = r"""
import os, socket, time
rank, n = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
resolved = socket.gethostbyname(addr)
keys = ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME", "SLURM_NTASKS", "SLURM_NNODES",
        "SLURM_JOB_NODELIST", "SLURM_JOB_ID"]
print("RANK " + " ".join(f"{k}={os.environ[k]}" for k in keys) + f" MASTER={addr}:{port} RESOLVED={resolved}", flush=True)
if rank == 0:
    server = socket.create_server((resolved, port))
    server.settimeout(30)
    for _ in range(n - 1):
        conn, _ = server.accept()
        print("RANK0 GOT " + conn.recv(64).decode(), flush=True)
        conn.close()
else:
    for _ in range(100):
        try:
            with socket.create_connection((resolved, port), timeout=5) as conn:
                conn.sendall(f"hello from {rank}".encode())
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"rank {rank} could not reach {addr}:{port}")
"""


def wait_for(run_dir: Path, scheduler, predicate, timeout: float, what: str) -> list[dict]:
    deadline = time.time() + timeout
    rows: list[JobRow] = []
    while time.time() < deadline:
        rows = job_table(run_dir, scheduler)
        if predicate(rows):
            return rows
        time.sleep(0.3)
    raise AssertionError(
        f"{what} not reached in {timeout} s: {[(r.job_id, r.state, r.reason) for r in rows]}"
    )


def all_ended(rows: list[JobRow]) -> bool:
    return all(r.state in ("completed", "failed", "cancelled", "timeout", "node_fail") for r in rows)


def test_cluster_status_env_and_idempotent_up(local_cluster, capsys):
    started = time.time()
    status = local_cluster.up(local_cluster.status_spec())
    assert time.time() - started < 10, "up on a running cluster must return at once"
    assert status["up"] and status["slurm_conf"] == str(local_cluster.slurm_conf)
    assert sorted(status["nodes"]) == ["node01", "node02", "node03", "node04"]
    from orchestrator.slurm.local_cluster import ClusterError, ClusterSpec

    with pytest.raises(ClusterError, match="already up"):
        local_cluster.up(ClusterSpec(nodes=5))
    assert main(["cluster", "status", "--json", "--dir", str(local_cluster.dir)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["slurm_conf"] == str(local_cluster.slurm_conf) and set(shown["nodes"].values()) <= {
        "idle",
        "alloc",
        "mix",
    }
    assert main(["cluster", "env", "--dir", str(local_cluster.dir)]) == 0
    assert capsys.readouterr().out.strip() == f"export SLURM_CONF={local_cluster.slurm_conf}"
    print(f"cluster came up in {status['up_seconds']} s")


def test_four_node_job_runs_one_rank_per_node_and_master_addr_resolves(
    local_cluster, slurm_scheduler, tmp_path
):
    run_dir = tmp_path / "run"
    result = submit_run(DEMO, run_dir, slurm_scheduler, command=[sys.executable, "-c", RENDEZVOUS])
    (job,) = result.job_ids
    rows = wait_for(run_dir, slurm_scheduler, all_ended, 60, "job end")
    out = (run_dir / "jobs" / f"slurm-{job}.out").read_text()
    print(out)
    assert (rows[0].state, rows[0].exit_code) == ("completed", 0), out
    # srun --label: every rank's line starts with its task number (what `runctl logs --rank` reads).
    found = re.finditer(r"^(\d+): (RANK SLURM_PROCID=(\d+) .*)$", out, re.M)
    ranks = {int(m.group(3)): m.group(2) for m in found if m.group(1) == m.group(3)}
    assert sorted(ranks) == [0, 1, 2, 3]
    # Every rank reaches the address and port the launcher announced for launch 0.
    port = re.search(r"runctl launcher: launch 0 on .* MASTER_PORT=(\d+)", out).group(1)
    hosts = set()
    for rank, line in ranks.items():
        fields = dict(f.split("=", 1) for f in line.split()[1:])
        assert fields["SLURM_NODEID"] == str(rank) and fields["SLURM_LOCALID"] == "0"
        assert fields["SLURM_NTASKS"] == "4" and fields["SLURM_NNODES"] == "4"
        assert fields["SLURM_JOB_NODELIST"] == "node[01-04]" and fields["SLURM_JOB_ID"] == job
        assert (
            fields["RESOLVED"] == "127.0.0.1" and fields["MASTER"] == f"127.0.0.1:{port}"
        )
        hosts.add(fields["SLURMD_NODENAME"])
    assert hosts == {"node01", "node02", "node03", "node04"}
    assert out.count("RANK0 GOT hello from") == 3
    assert (run_dir / "jobs" / job / "slurm.out").read_text() == out


def test_chain_of_three_singleton_jobs_runs_one_after_another(local_cluster, slurm_scheduler, tmp_path):
    run_dir = tmp_path / "chain"
    stamp = 'echo "SPAN $SLURM_JOB_ID $(date +%s.%N)"; sleep 1; echo "SPAN $SLURM_JOB_ID $(date +%s.%N)"'
    result = submit_run(DEMO, run_dir, slurm_scheduler, chain=3, command=["bash", "-c", stamp])
    rows = wait_for(run_dir, slurm_scheduler, all_ended, 90, "end of the chain")
    assert [r.state for r in rows] == ["completed"] * 3
    spans = []
    for job in result.job_ids:
        times = [
            float(t)
            for j, t in re.findall(
                r"^\d+: SPAN (\d+) ([\d.]+)$", (run_dir / "jobs" / f"slurm-{job}.out").read_text(), re.M
            )
        ]
        assert len(times) == 8  # 4 ranks x start/end
        spans.append((min(times), max(times)))
    print("spans:", [(round(a % 1000, 2), round(b % 1000, 2)) for a, b in spans])
    for (_, end), (start, _) in zip(spans[:-1], spans[1:], strict=True):
        assert start >= end, f"the next job of the chain started before the previous one ended: {spans}"


def test_cancel_stops_a_running_chain(local_cluster, slurm_scheduler, tmp_path):
    run_dir = tmp_path / "cancel"
    marker = tmp_path / "ranks-alive"
    result = submit_run(DEMO, run_dir, slurm_scheduler, chain=3,
                        command=["bash", "-c", f"while true; do date +%s > {marker}.$SLURM_PROCID; sleep 0.2; done"])  # fmt: skip
    wait_for(run_dir, slurm_scheduler, lambda rows: rows[0].state == "running", 60, "first job running")
    deadline = time.time() + 20
    while not all(Path(f"{marker}.{r}").exists() for r in range(4)) and time.time() < deadline:
        time.sleep(0.2)
    started = time.time()
    cancelled = cancel_run(run_dir, slurm_scheduler)
    assert sorted(cancelled) == sorted(result.job_ids)
    rows = wait_for(run_dir, slurm_scheduler, all_ended, 30, "every job cancelled")
    print(f"chain cancelled in {time.time() - started:.1f} s")
    assert [r.state for r in rows] == ["cancelled"] * 3
    for queued in rows[1:]:
        assert queued.started_at is None and queued.nodes == (), (
            f"queued jobs must never start: {queued}"
        )
    time.sleep(1.0)  # the ranks are gone: their heartbeat files stop changing
    before = {r: Path(f"{marker}.{r}").read_text() for r in range(4)}
    time.sleep(1.5)
    assert before == {r: Path(f"{marker}.{r}").read_text() for r in range(4)}
    ps = subprocess.run(["pgrep", "-f", f"{marker}"], capture_output=True, text=True)
    assert ps.stdout.strip() == "", f"rank processes still running: {ps.stdout}"


def test_the_ranks_exit_code_is_the_jobs_even_with_kill_on_bad_exit(local_cluster, slurm_scheduler, tmp_path):
    """All ranks exit 17 (kill switch): SLURM terminates the slower ones, yet the job says 17.
    One rank fails: the others are ended at once (not after their 60 s) and the job says 1."""
    agreed = "import sys, time; time.sleep(0.5); sys.exit(17)"
    one_fails = "import os, sys, time; r = int(os.environ['SLURM_PROCID']); time.sleep(0.5); sys.exit(1) if r == 2 else time.sleep(60)"
    runs = {}
    started = time.time()
    for name, code in (("agreed", agreed), ("one_fails", one_fails)):
        runs[name] = submit_run(DEMO, tmp_path / name, slurm_scheduler, command=[sys.executable, "-c", code])
    ended = {name: wait_for(tmp_path / name, slurm_scheduler, all_ended, 60, f"{name} ends")[0] for name in runs}
    print(f"both jobs ended in {time.time() - started:.1f} s:", {n: (r.state, r.exit_code) for n, r in ended.items()})
    assert (ended["agreed"].state, ended["agreed"].exit_code, ended["agreed"].outcome) == ("failed", 17, "killed")
    assert (ended["one_fails"].state, ended["one_fails"].exit_code) == ("failed", 1)
    assert time.time() - started < 40, "--kill-on-bad-exit must end the other ranks without waiting for them"
    (job,) = runs["one_fails"].job_ids
    first = RunPaths.of(tmp_path / "one_fails").launch_stderr(job, 0).read_text().splitlines()
    assert any("node03: task 2: Exited with exit code 1" in line for line in first[:2]), first


def test_scancel_signal_reaches_every_rank_and_the_job_goes_on(local_cluster, slurm_scheduler, tmp_path):
    """`scancel --signal=USR1` (what the pre-timeout --signal also does) reaches each rank directly;
    here the ranks answer like the trainer: save, exit 18 (time budget)."""
    ready = tmp_path / "ready"
    code = (
        "import os, signal, sys, time, pathlib; r = os.environ['SLURM_PROCID']\n"
        "signal.signal(signal.SIGUSR1, lambda *a: (print(f'rank {r} got USR1', flush=True), sys.exit(18)))\n"
        f"pathlib.Path('{ready}.' + r).touch()\n"
        "time.sleep(60)\n"
    )
    result = submit_run(DEMO, tmp_path / "sig", slurm_scheduler, command=[sys.executable, "-c", code])
    (job,) = result.job_ids
    deadline = time.time() + 30
    while not all(Path(f"{ready}.{r}").exists() for r in range(4)) and time.time() < deadline:
        time.sleep(0.2)
    slurm_scheduler.cancel([job], signal="USR1")
    row = wait_for(tmp_path / "sig", slurm_scheduler, all_ended, 30, "job end after USR1")[0]
    out = (tmp_path / "sig" / "jobs" / f"slurm-{job}.out").read_text()
    print(out)
    assert sorted(re.findall(r"rank (\d) got USR1", out)) == ["0", "1", "2", "3"]
    assert (row.state, row.exit_code, row.outcome) == ("failed", 18, "time_budget")


HOSTLISTS = ["node[01-04]", "node[01-03,07],gpu-a[9-10],login1", "node[1-2]-ib[01-02]", "node[01-02,01]",
             "n[9-11]", "node[08-10]", "a,b,c", "rack[1-2]n[01-02]"]  # fmt: skip


def test_host_lists_expand_as_slurm_expands_them(local_cluster):
    """python-hostlist (orchestrator/slurm/hostlist.py) against SLURM's own `scontrol show hostnames`."""
    from orchestrator.slurm.hostlist import expand_hostlist

    for text in HOSTLISTS:
        proc = subprocess.run(["scontrol", "show", "hostnames", text], env=local_cluster.slurm_env(),
                              capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        assert expand_hostlist(text) == proc.stdout.split(), text


def test_two_runs_of_one_config_do_not_wait_for_each_other(local_cluster, slurm_scheduler, tmp_path):
    """The singleton key is the run (its job name has a hash of the run directory), not the config's
    name: two run directories made from the one config run side by side (2 nodes each)."""
    import yaml

    data = yaml.safe_load(DEMO.read_text())
    data["cluster"].update(nodes=2, gpus_per_node=2, python=sys.executable)
    data["data"]["datasets"] = [{"path": str(REPO / "data" / "corpus" / "multilingual_text_document")}]
    data["data"]["tokenizer"] = str(REPO / "data" / "tokenizer.json")
    config = tmp_path / "two-nodes.yaml"
    config.write_text(yaml.safe_dump(data))
    marker = tmp_path / "both"
    # Each job waits (up to 30 s) until the other run's job has started too.
    wait = f"touch {marker}.$SLURM_JOB_ID; for i in $(seq 300); do [ $(ls {marker}.* | wc -l) -ge 2 ] && exit 0; sleep 0.1; done; exit 1"
    results = [submit_run(config, tmp_path / name, slurm_scheduler, command=["bash", "-c", wait]) for name in ("a", "b")]
    names = {r.job_name for r in results}
    assert len(names) == 2, f"two runs share the singleton key: {names}"
    rows = [wait_for(tmp_path / name, slurm_scheduler, all_ended, 60, f"run {name} ends")[0] for name in ("a", "b")]
    assert [(r.state, r.exit_code) for r in rows] == [("completed", 0)] * 2, rows


def test_logs_reads_one_ranks_lines_of_srun_label_output(local_cluster, slurm_scheduler, tmp_path, capsys):
    """`runctl logs RUN --rank N` on what SLURM's `srun --label` really writes: 12 tasks, so the
    labels are right-aligned to two characters (` 3: ...`, `11: ...`)."""
    import yaml

    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.plan.config import parse_config
    from orchestrator.slurm.base import SubmitRequest

    run_dir = tmp_path / "run"
    data = yaml.safe_load(DEMO.read_text())  # 4 nodes x 3 GPUs: 12 ranks, as the srun below
    data["cluster"]["gpus_per_node"], data["parallel"]["global_batch_size"] = 3, 12
    prepare_run_dir(parse_config(data, source=str(DEMO)), run_dir)
    script = tmp_path / "label.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --output={run_dir}/jobs/slurm-%j.out\n"
                      "echo 'not a rank line'\n"
                      "srun --label --ntasks=12 --overcommit bash -c 'echo \"rank $SLURM_PROCID of $SLURM_NTASKS\"'\n")  # fmt: skip
    job = slurm_scheduler.submit(SubmitRequest(script=script, job_name="label"))
    deadline = time.time() + 60
    while not slurm_scheduler.jobs([job])[job].state.is_terminal and time.time() < deadline:
        time.sleep(0.3)
    with capsys.disabled():
        print((run_dir / "jobs" / f"slurm-{job}.out").read_text())
    for rank in (3, 11):
        assert main(["logs", str(run_dir), "--rank", str(rank)]) == 0
        assert capsys.readouterr().out.splitlines() == [f"rank {rank} of 12"]
