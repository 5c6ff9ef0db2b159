"""Silent-data-corruption replay: `python -m trainer.replay RUN_DIR --step S --steps K [--output FILE]`.

One rank of a replay, started like the trainer (srun, SLURM's variables; the controller runs it as
an auxiliary job on other nodes: `runctl sdc-check`). It loads checkpoint S exactly as saved (hash
verified, its probe checked, no rollback directive, no fallback), replays steps S+1..S+K on exactly
the same samples (the checkpoint's data position and skip list, its RNG states, its LR schedule
and cut) and compares what it computes with what the run recorded in metrics.jsonl (the last record
of each step): the loss, the grad norm, the evaluation loss where one ran, and, with dp > 1, each
DP replica's own loss (`dp_losses`).

- On the CPU the comparison is bitwise (the kernels are deterministic): an untouched run matches
  exactly; any difference names the first step that differs, and the DP replicas whose loss
  differs (with their global ranks), when the run recorded per-replica losses.
- On a GPU it is within GPU_RTOL (relative; not measured here: set it from a replay of a run known
  good on the same GPUs).

Nothing is written to the run directory but the result (default reports/replay-step_SSSSSSS-kK.json):
no heartbeats, no metrics, no checkpoints, no damaged.jsonl. Rank 0 prints the result as JSON too.
Exit: 0 every step matched, 3 a mismatch (named in the result), 19 the run's config is refused,
1 anything else (the replay could not run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from orchestrator.contract import ExitCode, RunPaths, StepMetrics, atomic_write_json, read_metrics

MISMATCH = 3
GPU_RTOL = 1e-3
COMPARED = ("loss", "grad_norm", "eval_loss")


class NullHeartbeat:
    """A replay must not touch the run's heartbeats (the run may be training meanwhile)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def same(recorded: Any, replayed: Any, rtol: float) -> bool:
    if recorded is None or replayed is None:
        return recorded is None and replayed is None
    if rtol == 0.0:
        return recorded == replayed
    return math.isclose(recorded, replayed, rel_tol=rtol, abs_tol=0.0)


def finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def compare_step(recorded: StepMetrics | None, replayed: dict[str, Any], layout, rtol: float) -> dict[str, Any]:
    """One step's verdict: the fields that differ and, from dp_losses, the replicas that differ."""
    row: dict[str, Any] = {"step": replayed["step"], **{f"replayed_{k}": replayed.get(k) for k in COMPARED}}
    if recorded is None:
        return {**row, "match": None, "why": "not recorded in metrics.jsonl"}
    row.update({f"recorded_{k}": getattr(recorded, k) for k in COMPARED})
    differ = [k for k in COMPARED if (getattr(recorded, k) is not None or replayed.get(k) is not None)
              and not same(getattr(recorded, k), replayed.get(k), rtol)]
    replicas = []
    if recorded.dp_losses is not None and replayed.get("dp_losses") is not None:
        for d, (a, b) in enumerate(zip(recorded.dp_losses, replayed["dp_losses"], strict=True)):
            if not same(a, b, rtol):
                replicas.append({"dp_replica": d, "recorded_loss": a, "replayed_loss": b,
                                 "ranks": sorted(layout.rank_of(t, d, p) for t in range(layout.tp)
                                                 for p in range(layout.pp))})
    return {**row, "match": not differ and not replicas, "differ": differ, "dp_replicas": replicas}


def replay(trainer, paths: RunPaths, step: int, steps: int, rtol: float) -> dict[str, Any]:
    """Collective: load, replay, compare; the result (meaningful on rank 0)."""
    trainer.pinned = paths.checkpoint(step)
    trainer.build()
    trainer.resume()
    trainer.start_data()
    replayed = []
    for _ in range(steps):
        global_batch = trainer.next_global_batch()
        if global_batch is None:
            break
        record = trainer.train_step(global_batch)
        eval_loss = trainer.evaluate() if trainer.state.step % trainer.cfg.data.eval_interval == 0 else None
        replayed.append({"step": record["step"], "loss": finite_or_none(record["loss"]),
                         "grad_norm": finite_or_none(record["grad_norm"]), "eval_loss": finite_or_none(eval_loss),
                         "dp_losses": [finite_or_none(x) for x in record["dp_losses"]] if record["dp_losses"] else None})
    recorded = {m.step: m for m in read_metrics(paths.metrics)}
    rows = [compare_step(recorded.get(r["step"]), r, trainer.layout, rtol) for r in replayed]
    first = next((row for row in rows if row["match"] is False), None)
    return {
        "run_dir": str(paths.root), "checkpoint": paths.checkpoint(step).name, "steps_asked": steps,
        "steps_replayed": [r["step"] for r in replayed],
        "comparison": "bitwise" if rtol == 0.0 else f"relative tolerance {rtol:g}",
        "layout": {"tp": trainer.layout.tp, "pp": trainer.layout.pp, "dp": trainer.layout.dp},
        "probe_problems": trainer.probe_problems,
        "match": first is None and not trainer.probe_problems and all(row["match"] for row in rows),
        "first_mismatch": first, "per_step": rows,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, required=True, help="the checkpoint to replay from")
    parser.add_argument("--steps", type=int, default=1, help="how many steps to replay (default 1)")
    parser.add_argument("--output", help="result file (default RUN_DIR/reports/replay-step_SSSSSSS-kK.json)")
    args = parser.parse_args(argv)
    if args.step < 0 or args.steps < 1:
        parser.error("--step must be >= 0 and --steps >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from orchestrator.plan.config import ConfigError, load_config

    paths = RunPaths.of(args.run_dir)
    try:
        cfg = load_config(paths.config)
    except ConfigError as exc:
        print(f"[replay] {exc}", file=sys.stderr)
        return int(ExitCode.CONFIG_ERROR)
    paths = RunPaths.of(args.run_dir, cfg.checkpoint.dir)

    import bloom_kernels
    from trainer.launch import dist_env_from, init_distributed, shutdown_distributed
    from trainer.loop import Overrides, Trainer
    from trainer.parallel.groups import LayoutError

    dist = dist_env_from(os.environ)
    cpu = os.environ.get("DS_ACCELERATOR") == "cpu"
    try:
        init_distributed(dist, "cpu" if cpu else cfg.cluster.accelerator)
        bloom_kernels.set_kernel_path(cfg.model.kernels)
        bloom_kernels.set_attention_impl(cfg.model.attention)
        trainer = Trainer(cfg, paths, dist, Overrides(tensorboard=False), NullHeartbeat())
        result = replay(trainer, paths, args.step, args.steps, 0.0 if cpu else GPU_RTOL)
    except LayoutError as exc:
        print(f"[replay rank {dist.rank}] config refused: {exc}", file=sys.stderr, flush=True)
        return int(ExitCode.CONFIG_ERROR)
    except Exception:
        traceback.print_exc()
        return int(ExitCode.FAILED)
    if dist.rank == 0:
        output = Path(args.output) if args.output else paths.replay_report(args.step, args.steps)
        output.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(output, result)
        print(json.dumps(result, indent=1), flush=True)
    shutdown_distributed()
    return 0 if result["match"] else MISMATCH


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)
