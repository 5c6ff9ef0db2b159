"""`python -m trainer.health --run-dir RUN_DIR --job-dir JOB_DIR`: check this node (see
trainer/health/__init__.py for the file it writes and the exit codes)."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from orchestrator.contract import ExitCode, RunPaths, atomic_write_json
from trainer.faults import health_faults
from trainer.health.checks import (
    Check,
    check_memory,
    one_line,
    open_dir_nofollow,
    probe_dir,
    run_site_command,
    scratch_dir,
)
from trainer.health.gpu import check_gpus, gpu_checks_apply

# A node name becomes a file name: letters, digits, '_', '-', '.', starting with a letter or digit
# (so never '.', '..' or a path).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
USAGE_ERROR = 2
MAX_REASON_CHARS = 500


def node_name(env: dict[str, str]) -> str:
    name = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if not NODE_NAME.match(name):
        raise ValueError(f"node name {name!r} is not a safe file name ({NODE_NAME.pattern})")
    return name


class Result:
    """The checks so far and the one write of the node's file: the main thread and the watchdog
    race to write it; the first one wins and the other does nothing."""

    def __init__(self, path: Path, node: str, header: dict[str, Any], started: float):
        self.path, self.node, self.header, self.started = path, node, header, started
        self.checks: list[Check] = []
        self._lock = threading.Lock()
        self._written = False

    def write(self, extra: list[Check] = ()) -> bool:
        with self._lock:
            if self._written:
                return False
            checks = [*self.checks, *extra]
            failed = [c for c in checks if c.fails_node]
            unblamed = [c for c in checks if not c.ok and not c.node_fault]
            data = {
                "node": self.node,
                "ok": not failed,
                "reason": one_line("; ".join(f"{c.name}: {c.detail}" for c in failed), MAX_REASON_CHARS),
                "checks": [c.to_dict() for c in checks],
                "seconds": round(time.monotonic() - self.started, 3),
                **self.header,
                "time": time.time(),
            }
            if unblamed:
                data["allocation_problem"] = one_line("; ".join(f"{c.name}: {c.detail}" for c in unblamed))
            atomic_write_json(self.path, data)
            self._written = True
            return True


def local_checks(cfg: Any, paths: RunPaths, node: str, faults: set[str], env: dict[str, str]) -> list[Check]:
    health = cfg.health_check
    if health.command:
        env = {**env, "RUNCTL_RUN_DIR": str(paths.root), "RUNCTL_HEALTH_NODE": node}
        return [run_site_command(health.command, 0.5 * health.timeout_seconds, env)]
    bad_dir = "health_dir" in faults
    root = paths.root
    ckpt = paths.checkpoints
    ckpt_trusted = root if ckpt.is_relative_to(root) else ckpt.parent
    checks = [
        probe_dir("run_dir_writable", paths.heartbeats, root, node, bad_dir),  # where every rank writes
        probe_dir("checkpoint_dir_writable", ckpt, ckpt_trusted, node, bad_dir),
        probe_dir("scratch_dir_writable", scratch_dir(env), scratch_dir(env), node, bad_dir),
        check_memory(health.min_free_memory_gib, fail="health_memory" in faults),
    ]
    if gpu_checks_apply(cfg.cluster.accelerator, env):
        checks += check_gpus(
            cfg.cluster.gpus_per_node, health.require_nvlink, env, 0.2 * health.timeout_seconds
        )
        checks.append(check_torch_cuda())
    return checks


def check_torch_cuda() -> Check:
    """CUDA initialises in this process (NCCL needs it): fails when the driver and nvidia-smi are
    fine but CUDA is not, e.g. error 802 while nvidia-fabricmanager is down."""
    import torch

    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001
        return Check("torch_cuda", False, f"CUDA does not initialise: {exc}")
    if count == 0:
        return Check(
            "torch_cuda",
            False,
            "torch sees no GPU (CUDA_VISIBLE_DEVICES, driver, fabric manager?): "
            "check `nvidia-smi` and dmesg on this node",
        )
    return Check("torch_cuda", True, f"torch {torch.__version__} sees {count} GPU(s)")


def private_dir(health_dir: Path) -> None:
    """health/ of the job, 0700 (the rendezvous token lives there: trainer/health/secret.py); a
    planted symlink, or a folder of another user, is refused."""
    fd = open_dir_nofollow(health_dir, health_dir.parent, create=True)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionError(f"{health_dir} belongs to another user: remove it")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def run(args: argparse.Namespace, started: float) -> int:
    env = dict(os.environ)
    try:
        node = node_name(env)
    except ValueError as exc:
        print(f"[health] {exc}: set SLURMD_NODENAME to the node's SLURM name", file=sys.stderr)
        return USAGE_ERROR
    from orchestrator.plan.config import ConfigError, load_config

    try:
        cfg = load_config(RunPaths.of(args.run_dir).config)
    except ConfigError as exc:
        print(f"[health] {exc}", file=sys.stderr)
        return int(ExitCode.CONFIG_ERROR)
    paths = RunPaths.of(args.run_dir, cfg.checkpoint.dir)
    health_dir = Path(args.job_dir).resolve() / "health"
    health_dir.parent.mkdir(parents=True, exist_ok=True)
    private_dir(health_dir)
    # torch takes seconds to import (more from a shared filesystem): load it while the local checks
    # run, so that it eats less of the registration window.
    importer = threading.Thread(target=importlib.import_module, args=("torch.distributed",), daemon=True)
    importer.start()
    from trainer.health.rendezvous import Deadlines, Stage, check_allreduce, layout_from_env

    try:
        layout = layout_from_env(env, node)
    except ValueError as exc:
        print(f"[health {node}] {exc}", file=sys.stderr)
        return USAGE_ERROR
    header = {"job_id": layout.job_id, "step_id": layout.step_id, "rank": layout.rank}
    result = Result(health_dir / f"{node}.json", node, header, started)
    if not cfg.health_check.enabled:
        result.checks.append(Check("disabled", True, "health_check.enabled is false: nothing checked"))
        result.write()
        return 0
    timeout = cfg.health_check.timeout_seconds
    deadlines = Deadlines.from_timeout(started, timeout)
    stage = Stage()

    def watchdog() -> None:  # the file is written within timeout_seconds, whatever hangs
        if stage.on_this_node:  # stuck in its own checks or imports: this node's disk, driver or filesystem
            late = Check(
                "timeout",
                False,
                f"still in {stage.name} after {timeout:.0f} s (health_check."
                "timeout_seconds): a hung filesystem or driver on this node? drain it and look",
            )
        else:
            late = Check(
                "allreduce",
                False,
                f"timed out after {timeout:.0f} s during {stage.name}: not attributable to one node",
                node_fault=False,
            )
        if result.write([late]):
            print(f"[health {node}] timed out during {stage.name}", file=sys.stderr, flush=True)
            os._exit(0)

    timer = threading.Timer(max(0.0, deadlines.hard - time.monotonic()), watchdog)
    timer.daemon = True
    timer.start()
    faults = health_faults(env.get("TRAINER_FAULT", ""), node)
    result.checks = local_checks(cfg, paths, node, faults, env)
    local_ok = not any(c.fails_node for c in result.checks)
    stage("importing torch.distributed", on_this_node=True)
    importer.join()
    backend = "nccl" if gpu_checks_apply(cfg.cluster.accelerator, env) else "gloo"
    allreduce = check_allreduce(
        layout, local_ok, backend, deadlines, health_dir, stage, "health_unreachable" in faults
    )
    timer.cancel()
    result.write([allreduce])
    print(
        f"[health {node}] {'ok' if local_ok and allreduce.ok else 'see ' + str(result.path)}",
        file=sys.stderr,
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(prog="python -m trainer.health", description=__doc__)
    parser.add_argument("--run-dir", required=True, help="the run directory (its run.yaml has health_check:)")
    parser.add_argument(
        "--job-dir", required=True, help="the job's directory: results go to JOB_DIR/health/<node>.json"
    )
    args = parser.parse_args(argv)
    try:
        return run(args, started)
    except Exception:  # noqa: BLE001 - the checker itself broke: say so, no file (= unhealthy)
        traceback.print_exc()
        return int(ExitCode.FAILED)


if __name__ == "__main__":
    from orchestrator.contract.filemodes import owner_umask

    with owner_umask():  # before health/ and the node's file are made
        code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # gloo/NCCL threads must not turn the exit into a hang
