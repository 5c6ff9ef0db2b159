"""`make demo` (`python -m orchestrator.demo`): a training run that survives a GPU failure.

1. bring up a local SLURM cluster: 4 nodes for the job + 1 spare;
2. submit configs/demo-cpu-4node.yaml (tp=2 x pp=2, one rank per node) with `cluster.spare_nodes: 1`:
   the job holds all 5 nodes, checks their health, and trains on 4;
3. halfway through (3 steps after a checkpoint, so that some work is lost), SIGKILL one rank (a
   simulated GPU failure) and show the detection and the fast recovery: the launch ends, the
   controller decides, and the job's launcher relaunches on the spare at once, from the warm
   standby, inside the same job (no queue, no new job); the trainer resumes from the last
   checkpoint;
4. when training finishes, print the summary and where the report (loss curve PNG) is.

`--slurm 24.11` (`make demo DEMO_ARGS="--slurm 24.11"`) runs it on Debian 13's Slurm 24.11 instead of
the host's: the cluster of orchestrator/slurm/isolated.py (its root is built on first use, ~1-4 min).
Without root or Debian's SLURM packages it stops and says why. `--mock` (or RUNCTL_SCHEDULER=mock;
`make demo DEMO_ARGS=--mock`) runs it on the mocked SLURM in execute mode instead (batch scripts run
on this machine through an srun shim; NOT SLURM): the mock is chosen only when asked for.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from orchestrator.contract import Heartbeat, Phase, read_heartbeats

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo-cpu-4node.yaml"
DEMO_CLUSTER_DIR = Path(os.environ.get("RUNCTL_DEMO_CLUSTER_DIR", "/tmp/runctl-demo-cluster"))


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def real_cluster_or_reason(nodes: int, release: str = "22.05"):
    """(LocalCluster, env) or (None, why not)."""
    from orchestrator.slurm.isolated import IsolatedCluster
    from orchestrator.slurm.local_cluster import ClusterSpec, LocalCluster, find_binary

    # 24.11 comes from a root of its own: nothing of the host's SLURM is needed.
    needed = ("slurmctld", "slurmd", "sbatch", "munged") if release == "22.05" else ()
    missing = [b for b in needed if find_binary(b) is None]
    if os.geteuid() != 0:
        return None, "not root (the local cluster runs slurmd as root)"
    if missing and find_binary("apt-get") is None:
        return None, f"SLURM is not installed ({', '.join(missing)}) and this is not Debian (no apt-get)"
    cluster = (
        LocalCluster(DEMO_CLUSTER_DIR) if release == "22.05" else IsolatedCluster(f"{DEMO_CLUSTER_DIR}-2411")
    )
    try:
        # Ports away from the default cluster (16817/17001+) and the test clusters (26000+).
        cluster.up(
            ClusterSpec(
                nodes=nodes, gpus_per_node=1, cpus_per_node=2, ctld_port=16717, slurmd_base_port=16721
            ),
            timeout=180,
        )
    except Exception as exc:  # any failure to start SLURM: the reason, for the error message
        return None, f"the local SLURM cluster did not come up: {exc}"
    return cluster, None


def prepare(args, run_dir: Path):
    from orchestrator.operate.runs import prepare_run_dir
    from orchestrator.plan.config import load_config

    cfg = load_config(args.config)
    # Every "node" is this machine: the ranks run this interpreter (it has torch and deepspeed).
    # On the real local cluster the job also holds its fifth node as a spare (the fast recovery
    # path); the mocked SLURM runs the plain job script only (its srun shim has no steps).
    spares = 0 if args.mock_in_use else 1
    cluster = cfg.cluster.model_copy(update={"spare_nodes": spares})
    cfg = cfg.model_copy(update={"cluster": cluster})
    if args.dataset:
        data = cfg.data.model_copy(
            update={
                "datasets": [
                    cfg.data.datasets[0].model_copy(
                        update={"path": str(Path(args.dataset).resolve()), "weight": 1.0}
                    )
                ]
            }
        )
        cfg = cfg.model_copy(update={"data": data})
    missing = [d.path for d in cfg.data.datasets if not Path(d.path + ".idx").exists()]
    if missing:
        raise SystemExit(
            f"demo: dataset {missing[0]}.bin/.idx not found: build the corpus first "
            f"(`make data`, or python -m trainer.data.preprocess), or pass --dataset PREFIX"
        )
    prepare_run_dir(cfg, run_dir)
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(DEMO_CONFIG))
    parser.add_argument("--run-dir", help="default: runs/demo-<time>")
    parser.add_argument("--dataset", help="dataset prefix to use instead of the config's")
    parser.add_argument(
        "--mock", action="store_true", help="use the mocked SLURM even where a real cluster could run"
    )
    parser.add_argument(
        "--slurm", choices=("22.05", "24.11"), default="22.05",
        help="the host's SLURM (Debian 12's 22.05) or Debian 13's 24.11 from a root of its own",
    )  # fmt: skip
    parser.add_argument("--keep-cluster", action="store_true", help="leave the local cluster up at the end")
    parser.add_argument("--no-fault", action="store_true", help="do not kill a rank")
    parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    args = parser.parse_args(argv)

    from orchestrator.contract.events import read_events
    from orchestrator.contract.state import RunStatus
    from orchestrator.controller import Controller
    from orchestrator.operate.runs import submit_job
    from orchestrator.views.event_text import clock, sentence
    from orchestrator.views.report import write_report

    run_dir = Path(args.run_dir or REPO / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    env = {**os.environ, "TRAINER_TENSORBOARD": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    use_mock = args.mock or os.environ.get("RUNCTL_SCHEDULER", "").strip().lower() == "mock"
    cluster, why_not = (
        (None, "the mock was asked for") if use_mock else real_cluster_or_reason(nodes=5, release=args.slurm)
    )
    if cluster is None and not use_mock:
        print(
            f"demo: no local SLURM cluster: {why_not}.\nRun it as root on Debian (the demo installs "
            "slurm-wlm), or on the mocked SLURM (NOT SLURM): `make demo DEMO_ARGS=--mock` or "
            "`python -m orchestrator.demo --mock`",
            file=sys.stderr,
        )
        return 2
    if cluster is not None:
        from orchestrator.slurm.real import SlurmScheduler

        say(
            f"local SLURM {args.slurm} cluster up: 5 nodes (4 for the job, 1 spare), slurm.conf {cluster.slurm_conf}"
        )
        scheduler = SlurmScheduler(env={**env, **cluster.slurm_env()})
    else:
        from orchestrator.slurm.mock import MockScheduler

        say(
            f"NOT SLURM: {why_not}. Using the mocked SLURM in execute mode (the batch script runs "
            "on this machine through an srun shim; node names are pretend and excluding one changes nothing)"
        )
        os.environ.setdefault("RUNCTL_MOCK_SLURM_DIR", str(run_dir.parent / ".mock-slurm"))
        scheduler = MockScheduler(directory=os.environ["RUNCTL_MOCK_SLURM_DIR"], execute=True)

    args.mock_in_use = cluster is None
    cfg = prepare(args, run_dir)
    total = -(-cfg.train_samples // cfg.parallel.global_batch_size)
    job = submit_job(run_dir, cfg, scheduler, reason="demo")
    say(
        f"submitted {Path(args.config).name} as job {job}: {cfg.world_size} ranks (tp={cfg.parallel.tp} "
        f"pp={cfg.parallel.pp} dp={cfg.dp}), {total} steps, a checkpoint every {cfg.checkpoint.interval_steps} steps; "
        f"run directory {run_dir}"
    )
    controller = Controller(run_dir, cfg, scheduler, stack_wait_seconds=3.0)
    controller.start()
    fault = {"done": args.no_fault}
    seen = {"events": 0, "steps": False}

    def on_pass(result) -> None:
        events = read_events(controller.paths.events)
        for event in events[seen["events"] :]:
            print(f"[controller] {clock(event.time)} {sentence(event)}", flush=True)
        seen["events"] = len(events)
        a = result.assessment
        seen["steps"] = seen["steps"] or bool(a and a.max_step is not None)
        if a and a.max_step is not None and int(time.time()) % 5 == 0:
            print(
                f"[watch] job {a.job_id}: {a.ranks_seen} ranks beating, step {a.max_step}/{total}", flush=True
            )
        if (
            not fault["done"]
            and a
            and a.max_step is not None
            and a.max_step >= total // 2 + 3
            and a.reference
        ):
            victim = _rank_beat(controller, a.job_id, 1)
            if victim:
                say(f"SIMULATED GPU FAILURE: SIGKILL rank 1 (pid {victim.pid}) at step {victim.step}")
                try:  # the 24.11 cluster's ranks have pids of its own PID namespace
                    getattr(cluster, "signal_in_cluster", os.kill)(victim.pid, signal.SIGKILL)
                except ProcessLookupError:
                    return
                fault["done"] = True

    began = time.monotonic()
    try:
        status = controller.run(on_pass=on_pass, max_seconds=args.timeout)
    finally:
        controller.stop()
    say(f"run {status} after {time.monotonic() - began:.0f} s")
    summary = write_report(run_dir)
    for n, incident in enumerate(summary["incidents"], 1):
        print(
            f"incident {n}: {incident['cause']} in job {incident['failed_job']}; detected "
            f"{_s(incident['detection_latency_s'])} after the failure; training again after "
            f"{_s(incident['failure_to_first_step_s'])}; resumed from step {incident['resume_step']}, "  # not a beat or event: the report's incident
            f"lost {incident['work_lost_steps']} step(s); excluded {incident['excluded'] or 'none'}"  # not a beat or event: the report's incident
        )
        path = (
            "inside the job, on a spare (no queue)" if incident["in_allocation"] else "job-level"
        )  # not a beat or event: the report's incident
        print(f"  recovery path: {path}: {incident['how']}")
    if summary["final_loss"] is not None:
        print(f"{summary['steps']} steps, final loss {summary['final_loss']:.4f}")
    print(
        f"report: {summary['loss_png'] or summary.get('loss_png_skipped')}\nsummary: {summary['summary_json']}"
    )
    print(f"look around: runctl status {run_dir}; runctl events {run_dir}; runctl report {run_dir}")
    if cluster is not None and not args.keep_cluster:
        cluster.down()
        say("local cluster stopped (--keep-cluster keeps it)")
    if summary["goodput"] is not None:  # the demo ends with where its wall time went
        from orchestrator.cli.report_cmd import print_goodput

        say("where the wall time went (orchestrator/views/goodput.py)")
        print_goodput(summary)
    failed = demo_failed(status == RunStatus.FINISHED, seen["steps"], not args.no_fault,
                         fault["done"], len(summary["incidents"]))  # fmt: skip
    if failed:
        print(f"demo FAILED: {failed}", file=sys.stderr)
    return 1 if failed else 0


def demo_failed(finished: bool, saw_steps: bool, fault_wanted: bool, fault_done: bool, incidents: int) -> str:
    """Why the demo did not show what it promises ('' when it did): a run that finished while the
    controller never saw it train, or never noticed the rank it killed, supervised nothing."""
    if not saw_steps:
        return "the controller never saw a rank train (it could not read the job or its heartbeats)"
    if fault_wanted and not fault_done:
        return "the run ended before the rank could be killed"
    if fault_wanted and incidents == 0:
        return "a rank was killed and the controller reported no incident: nothing was supervised"
    if not finished:
        return "the run did not finish"
    return ""


def _rank_beat(controller, job_id: str, rank: int) -> Heartbeat | None:
    beat = next((b for b in read_heartbeats(controller.paths.heartbeats) if b.rank == rank), None)
    return beat if beat is not None and beat.job_id == str(job_id) and beat.phase is Phase.STEP else None


def _s(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "?"


if __name__ == "__main__":
    from orchestrator.contract.filemodes import owner_umask

    with owner_umask():  # the owner's modes for the run it makes and the controller it runs
        code = main()
    sys.exit(code)
