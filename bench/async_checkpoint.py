"""The checkpoint save stall seen by training, asynchronous vs synchronous saves, in one run; and
kills during an async save that must lose nothing.

    python bench/async_checkpoint.py [--out bench/results/async_checkpoint.json] [--steps 8 --step-delay 0.5]

Rows (every one runs `python -m trainer` as real processes on CPU, one rank, DeepSpeed BF16 + ZeRO-1):
- stall: for the tiny model (the tests' 2 layers x h=32) and for a model whose checkpoint is a few
  hundred MB (8 layers x h=512), the same run with `checkpoint.async_save` false then true, a save
  every SAVE_EVERY steps. The stall is what the trainer logs for each save: from the save point to
  training going on again (sync: DeepSpeed's files + RNG + hashing + MANIFEST + `latest`; async:
  the host snapshot, plus any wait for the previous write). Median over the saves; ratio =
  async / sync. Target: <= 0.15 on the larger model. Saves are spaced (STEP_DELAY) so that, as in a
  real run (hours apart), a background write ends before the next save. The first async save
  allocates the host buffers; later ones reuse them (the stall list shows both).
- kill during the async write (TRAINER_FAULT=killwrite: SIGKILL once the writer put the first file
  of a save on disk) and kill during the snapshot (killsnapshot): `latest` must still name the
  previous checkpoint, the partial one must have no MANIFEST, and a new process must resume from
  `latest` and finish. The tiny model: the faults are deterministic hooks (trainer.faults), the
  kill lands after the first of a save's 9 files, whatever their size.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.contract import (  # noqa: E402
    MANIFEST_NAME,
    ExitCode,
    RunPaths,
    read_latest,  # noqa: E402
    verify_manifest,
)
from tests.trainer import launch_local  # noqa: E402
from tests.trainer.runs import make_run_dir  # noqa: E402

TARGET_RATIO = 0.15
SAVE_EVERY = 2  # steps between saves
MODELS = {
    "tiny": {},  # the tests' tiny model (tests.trainer.runs)
    "large": {"model": {"num_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 32}},
}
STALL = re.compile(r"\[trainer\] (saved|snapshot of) (step_\d+) \(([^)]*)\) in ([0-9.]+)s")
WAITED = re.compile(r"waited ([0-9.]+)s for the background write")
SEALED = re.compile(r"wrote and sealed (step_\d+) in the background in ([0-9.]+)s")


def checkpoint_mb(ckpt_dir: Path) -> float:
    return sum(p.stat().st_size for p in ckpt_dir.rglob("*") if p.is_file()) / 1e6


def stall_row(work: Path, model: str, steps: int, step_delay: float) -> dict:
    row: dict = {"model": model, "saves_per_run": steps // SAVE_EVERY}
    for variant in ("sync", "async"):
        run = make_run_dir(work / f"{model}-{variant}", **MODELS[model],
                           checkpoint={"interval_steps": SAVE_EVERY, "keep_last": 2,
                                       "async_save": variant == "async"})
        started = time.time()
        codes = launch_local.run(run, 1, {"TRAINER_MAX_STEPS": str(steps),
                                          "TRAINER_STEP_DELAY_SECONDS": str(step_delay)}, timeout=900)
        log = launch_local.read_log(run)
        if codes != [ExitCode.FINISHED]:
            raise SystemExit(f"{model} {variant}: exit {codes}; see {run}/logs/rank-0.log")
        stalls = [float(m.group(4)) for m in STALL.finditer(log)]
        paths = RunPaths.of(run)
        latest = read_latest(paths.checkpoints)
        row[variant] = {
            "stall_seconds": stalls,
            "median_stall_seconds": statistics.median(stalls),
            "waited_for_previous_write_seconds": [float(w) for w in WAITED.findall(log)],
            "background_write_seconds": [float(s) for _, s in SEALED.findall(log)],
            "run_seconds": round(time.time() - started, 1),
            "latest": latest,
            "latest_verifies": verify_manifest(paths.checkpoints / latest) == [],
        }
        row["checkpoint_mb"] = round(checkpoint_mb(paths.checkpoints / latest), 1)
    row["async_over_sync"] = row["async"]["median_stall_seconds"] / row["sync"]["median_stall_seconds"]
    print(f"{model}: checkpoint {row['checkpoint_mb']} MB, stall sync {row['sync']['median_stall_seconds']:.3f}s "
          f"async {row['async']['median_stall_seconds']:.3f}s, ratio {row['async_over_sync']:.3f}", flush=True)
    return row


def kill_row(work: Path, fault: str) -> dict:
    """Saves at steps 2 and 4; the fault hits the save of step 4. Nothing may be lost."""
    run = make_run_dir(work / f"kill-{fault}", **MODELS["tiny"],
                       checkpoint={"interval_steps": 2, "keep_last": 3, "async_save": True})
    codes = launch_local.run(run, 1, {"TRAINER_MAX_STEPS": "6", "TRAINER_FAULT": f"{fault}@step4"}, timeout=600)
    paths = RunPaths.of(run)
    partial = paths.checkpoint(4)
    row = {
        "fault": fault,
        "exit_code": codes[0],
        "latest": read_latest(paths.checkpoints),
        "previous_verifies": verify_manifest(paths.checkpoint(2)) == [],
        "partial_dir_exists": partial.is_dir(),
        "partial_has_manifest": (partial / MANIFEST_NAME).exists(),
    }
    resumed = launch_local.run(run, 1, {"TRAINER_MAX_STEPS": "6"}, timeout=600)
    log = launch_local.read_log(run)
    row["resume_exit_code"] = resumed[0]
    row["resumed_from"] = (re.findall(r"resumed from (step_\d+)", log) or [None])[-1]
    row["nothing_lost"] = bool(
        codes[0] == -9 and row["latest"] == "step_0000002" and row["previous_verifies"]
        and not row["partial_has_manifest"] and resumed == [ExitCode.FINISHED]
        and row["resumed_from"] == "step_0000002"  # not a beat or event: this benchmark's row
    )
    print(f"kill ({fault}): {row}", flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "async_checkpoint.json"))
    parser.add_argument("--work", default="/tmp/bench-async-checkpoint")
    parser.add_argument("--steps", type=int, default=8, help="steps per stall run (a save every 2)")
    parser.add_argument("--step-delay", type=float, default=0.5, help="extra seconds per step (spaces saves)")
    args = parser.parse_args()
    work = Path(args.work)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    rows = [stall_row(work, model, args.steps, args.step_delay) for model in MODELS]
    kills = [kill_row(work, fault) for fault in ("killwrite", "killsnapshot")]
    large = next(r for r in rows if r["model"] == "large")
    result = {
        "what": "checkpoint save stall seen by training, async vs sync (median per save), and kills during "
                "an async save",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "note": "CPU only, 1 rank, OMP_NUM_THREADS=1; shared machine, timings are noisy"},
        "stall": rows,
        "kills": kills,
        "target": f"async stall <= {TARGET_RATIO:.0%} of the sync save on the larger model; kills lose nothing",
        "large_model_ratio": large["async_over_sync"],
        "meets_target": large["async_over_sync"] <= TARGET_RATIO and all(k["nothing_lost"] for k in kills),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}: large-model ratio {large['async_over_sync']:.3f} (target <= {TARGET_RATIO}), "
          f"kills nothing lost: {[k['nothing_lost'] for k in kills]}")
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
