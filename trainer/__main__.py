"""`python -m trainer RUN_DIR`: one rank of a training run (started by srun, torchrun, or by hand).

Reads RUN_DIR/run.yaml (the frozen config, `orchestrator.plan.config.dump_config`), sets up
torch.distributed from SLURM's variables (trainer.launch), trains, and exits with a code of
`orchestrator.contract.ExitCode`: FINISHED 0, FAILED 1 (any exception), KILLED 17 (kill switch,
checkpoint saved), TIME_BUDGET 18 (exit duration / pre-timeout signal, checkpoint saved),
CONFIG_ERROR 19 (run.yaml refused).

Environment overrides (for tests, CI and the controller demo; none is needed in production):
    TRAINER_MAX_STEPS=N            stop after global step N as if the data ended (save, exit 0)
    TRAINER_STOP_AFTER_STEPS=N     run N steps in this process, save, exit TIME_BUDGET (18): a job
                                   that reached its time limit; the next job resumes
    TRAINER_JOB_START_TIME=EPOCH   when the job started (the sbatch script may export
                                   `$(date +%s)`); checkpoint.exit_duration_minutes counts from
                                   here. Default: this process's start.
    TRAINER_STEP_DELAY_SECONDS=S   sleep S before every step (the demo: slow enough to watch)
    TRAINER_TENSORBOARD=0          no TensorBoard event files (metrics.jsonl only)
    TRAINER_SAMPLE_LOG=1           logs/samples-dp<d>.jsonl: the sample positions each step read
                                   (trainer/data/sample_log.py; tests of the exact data skip, audits)
    TRAINER_JOB_ID=ID              job id for heartbeats when not under SLURM (default "local")
    TRAINER_FAULT=...              TEST-ONLY fault injection, comma-separated KIND@stepN[:rankR]
                                   with KIND nan, hang, crash, sigkill, sigusr1, spike,
                                   corruptmaster... (trainer.faults), or poison@samplesA-B,
                                   e.g. TRAINER_FAULT=nan@step5  or  hang@step7:rank1
    DS_ACCELERATOR=cpu             CPU + gloo (otherwise CUDA + NCCL, per cluster.accelerator)
"""

from __future__ import annotations

import gc
import os
import sys
import time
import traceback

from orchestrator.contract import ExitCode, RunPaths

USAGE = "usage: python -m trainer RUN_DIR   (RUN_DIR/run.yaml is the frozen run config)"



def out_of_memory(exc: BaseException) -> bool:
    """Host memory (MemoryError) or the accelerator's (torch.OutOfMemoryError): exit 21, so the
    controller restarts without blaming the node (it would run out on any node)."""
    import torch

    return isinstance(exc, (MemoryError, torch.OutOfMemoryError))

def main(argv: list[str] | None = None, prepared=None) -> int:
    """`prepared`: what the warm standby did before its go (trainer/prepared_start.py)."""
    process_start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__ if argv[:1] in (["-h"], ["--help"]) else USAGE, file=sys.stderr)
        return int(ExitCode.CONFIG_ERROR)
    paths = RunPaths.of(argv[0])

    from orchestrator.plan.config import ConfigError, load_config

    cfg = prepared.config_for(paths.config) if prepared is not None else None
    if cfg is None:
        prepared = None  # run.yaml changed since the standby read it: nothing of it is used
        try:
            cfg = load_config(paths.config)
        except ConfigError as exc:
            print(f"[trainer] {exc}", file=sys.stderr)
            return int(ExitCode.CONFIG_ERROR)
    # The data and the tokenizer, checked as `runctl submit` checked them on the login node, before
    # torch is imported: gone since then (a moved dataset, an unmounted filesystem) is a config
    # error, one stop of the run, not a crash that restarts and excludes healthy nodes.
    from orchestrator.plan.preflight import data_checks

    missing = [check.message for check in data_checks(cfg) if check.level == "error"]
    if missing:
        print("[trainer] config refused:\n" + "\n".join(f"  - {m}" for m in missing), file=sys.stderr, flush=True)
        return int(ExitCode.CONFIG_ERROR)
    # The checkpoints are where the config says (checkpoint.dir), as for the controller.
    paths = RunPaths.of(argv[0], cfg.checkpoint.dir)
    from trainer.start_phases import PHASES

    PHASES.start(process_start)
    PHASES.mark("config")

    from trainer.launch import dist_env_from, init_distributed, shutdown_distributed
    from trainer.loop import Overrides

    try:
        overrides = Overrides.from_env(os.environ)
        dist = dist_env_from(os.environ)
    except (ValueError, RuntimeError) as exc:
        print(f"[trainer] {exc}", file=sys.stderr)
        return int(ExitCode.CONFIG_ERROR)
    if overrides.job_start_time is None:
        overrides.job_start_time = process_start

    from orchestrator.contract.client.beat import HeartbeatWriter
    from orchestrator.contract.client.exits import record_exit
    from orchestrator.contract.client.stop import install_signal_flag
    from trainer.parallel.groups import LayoutError

    install_signal_flag(cfg.cluster.pre_timeout_signal)  # now: SLURM may signal during a long init

    heartbeat = HeartbeatWriter(paths, dist.rank, dist.world_size, dist.job_id, cfg.watchdog.heartbeat_seconds,
                                local_rank=dist.local_rank, local_world_size=dist.local_world_size).start()
    trainer = None
    code = ExitCode.FAILED
    try:
        init_distributed(dist, "cpu" if os.environ.get("DS_ACCELERATOR") == "cpu" else cfg.cluster.accelerator)
        PHASES.mark("rendezvous")
        import bloom_kernels

        bloom_kernels.set_kernel_path(cfg.model.kernels)
        bloom_kernels.set_attention_impl(cfg.model.attention)
        from trainer.loop import Trainer

        # What the imports left on the heap is never garbage: out of the collector's sight (as in the
        # warm standby), DeepSpeed's forced collections while it builds the engine see only what
        # the start creates.
        gc.freeze()
        try:
            trainer = Trainer(cfg, paths, dist, overrides, heartbeat)  # validates schedules
        except ValueError as exc:
            raise LayoutError(str(exc)) from exc
        trainer.prepared, prepared = prepared, None
        trainer.build()
        trainer.resume()
        code = trainer.train()
    except LayoutError as exc:  # the config cannot run on this job: a restart would fail the same way
        print(f"[trainer rank {dist.rank}] config refused: {exc}", file=sys.stderr, flush=True)
        code = ExitCode.CONFIG_ERROR
    except Exception as exc:
        traceback.print_exc()
        code = ExitCode.OUT_OF_MEMORY if out_of_memory(exc) else ExitCode.FAILED
        print(f"[trainer rank {dist.rank}] FAILED (exit {int(code)})", file=sys.stderr, flush=True)
    finally:
        if trainer is not None:
            trainer.close()
        record_exit(heartbeat, code)
    if code not in (ExitCode.FAILED, ExitCode.CONFIG_ERROR):
        shutdown_distributed()  # after a failure, peers may be stuck: do not wait on them
    sys.stdout.flush()
    sys.stderr.flush()
    return int(code)


if __name__ == "__main__":
    from orchestrator.contract.client.exits import exit_now

    exit_now(main())
