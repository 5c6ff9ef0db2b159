"""The checkpoint save stall, asynchronous vs synchronous, with the model on ONE CUDA GPU.

    python bench/async_checkpoint_gpu.py [--out bench/results/async_checkpoint_gpu.json] [--models large,xl]

The same measurement as bench/async_checkpoint.py (its `stall_row`: the same run with
`checkpoint.async_save` false then true, the stall each save logs, median, ratio async / sync), but
`cluster.accelerator: cuda` and DS_ACCELERATOR=cuda (NCCL, world size 1): the async snapshot is
then the GPU path of trainer/async_checkpoint.py, non-blocking copies into pinned host memory with
one synchronize, instead of the CPU clone. Rows:
  large  8 layers x h=512  (~380 MB checkpoint; the CPU bench's target model, to compare)
  xl     12 layers x h=1024 (~2.2 GB checkpoint); saves are spaced (--xl-step-delay) so that a
         background write ends before the next save, as in a real run.
The kill rows of the CPU bench are not repeated: the fault hooks do not depend on the device.
tests/trainer/test_trainer_async_checkpoint.py cannot run as it is on one GPU: its first test
needs 2 ranks (dp=2), and NCCL refuses two ranks on the same GPU; both tests pin DS_ACCELERATOR=cpu.

Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import async_checkpoint as cpu_bench  # noqa: E402  (bench/async_checkpoint.py)

from tests.trainer import launch_local  # noqa: E402
from tests.trainer.runs import merge  # noqa: E402

ON_GPU = {"cluster": {"accelerator": "cuda", "env": {"DS_ACCELERATOR": "cuda", "OMP_NUM_THREADS": "2"}}}
MODELS = {
    "large": cpu_bench.MODELS["large"],
    "xl": {"model": {"num_layers": 12, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 32}},
}


def _run_on_gpu(run_dir, nranks=1, env=None, **kwargs):
    # launch_local pins DS_ACCELERATOR=cpu for the CPU tests; the extra env it takes wins over it
    return launch_local.run(run_dir, nranks, {**(env or {}), "DS_ACCELERATOR": "cuda"}, **kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "async_checkpoint_gpu.json"))
    parser.add_argument("--work", default="/tmp/bench-async-checkpoint-gpu")
    parser.add_argument("--models", default="large,xl")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (a save every 2)")
    parser.add_argument("--step-delay", type=float, default=0.5, help="extra seconds per step, large model")
    parser.add_argument("--xl-steps", type=int, default=6)
    parser.add_argument("--xl-step-delay", type=float, default=3.0, help="extra seconds per step, xl model")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("async_checkpoint_gpu: no CUDA GPU here; nothing measured (bench/async_checkpoint.py is the CPU one)")
        return 0
    # stall_row reads the model changes from its module's MODELS and starts ranks via its launch_local
    cpu_bench.MODELS = {name: merge(changes, ON_GPU) for name, changes in MODELS.items()}
    cpu_bench.launch_local = SimpleNamespace(run=_run_on_gpu, read_log=launch_local.read_log)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    rows = []
    for model in args.models.split(","):
        steps, delay = (args.xl_steps, args.xl_step_delay) if model == "xl" else (args.steps, args.step_delay)
        row = cpu_bench.stall_row(work, model, steps, delay)
        row["steps"], row["step_delay_seconds"] = steps, delay
        rows.append(row)
        shutil.rmtree(work, ignore_errors=True)  # a few GB of checkpoints per row
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(_result(rows, torch), indent=2) + "\n")  # after each row
    print(f"wrote {args.out}: " + ", ".join(f"{r['model']} async/sync {r['async_over_sync']:.3f}" for r in rows))
    return 0


def _result(rows: list[dict], torch) -> dict:
    return {
        "what": "checkpoint save stall seen by training, async vs sync (median per save), model on one CUDA GPU",
        "machine": {"device": torch.cuda.get_device_name(0), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "note": "1 rank, NCCL; the first async save allocates the pinned host buffers"},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stall": rows,
        "target": f"async stall <= {cpu_bench.TARGET_RATIO:.0%} of the sync save",
        "ratios": {r["model"]: r["async_over_sync"] for r in rows},
    }


if __name__ == "__main__":
    sys.exit(main())
