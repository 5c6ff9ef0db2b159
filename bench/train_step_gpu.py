"""Achieved TFLOPs and MFU of a training step of a 1B-class BLOOM on one GPU, through the real trainer path.

    python bench/train_step_gpu.py [--preset bloom-1b7] [--micro-batch 4 --grad-accum 4 --seq 2048]
                                   [--recompute] [--kernels auto] [--steps 10]
                                   [--out bench/results/train_step_gpu.json]

The step is the trainer's: our BLOOM PipelineModule in DeepSpeed's PipelineEngine, bf16 weights,
BF16_Optimizer (fp32 master + fp32 gradient accumulation, ZeRO-1), AdamW, clipping; random tokens.
FLOPs by Megatron's formula (trainer.metrics / orchestrator.planner):
    model FLOPs    72 B s l h^2 (1 + s/6h + V/16lh)     (forward + backward)
    hardware FLOPs 96 B s l h^2 (...)  with --recompute  (one more forward)
MFU = model TFLOPs / the GPU's dense bf16 peak (table below, or --peak-tflops).

Without a GPU it prints a message and exits 0 (`--allow-cpu` runs a tiny smoke config on the CPU
instead, to test this script itself; its numbers mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (layers, hidden, heads): the BLOOM family's 1B-class members.
PRESETS = {"bloom-1b1": (24, 1536, 16), "bloom-1b7": (24, 2048, 16), "smoke": (2, 64, 4)}
# Dense bf16 peak TFLOPs by device-name fragment (no sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "A10": 125.0, "L40": 181.0, "V100": 125.0}


def peak_for(name: str) -> float | None:
    for fragment, peak in PEAK_TFLOPS.items():
        if fragment in name:
            return peak
    return None


def bench_cfg(args, gpu: bool):
    from orchestrator.config import parse_config

    layers, hidden, heads = PRESETS[args.preset]
    vocab = 250_880 if args.preset != "smoke" else 512
    return parse_config({
        "name": f"bench-{args.preset}",
        "seed": 1,
        "cluster": {"nodes": 1, "gpus_per_node": 1, "accelerator": "cuda" if gpu else "cpu"},
        "model": {"num_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
                  "seq_length": args.seq, "vocab_size": 250_680 if args.preset != "smoke" else vocab,
                  "padded_vocab_size": vocab, "dtype": "bf16", "kernels": args.kernels},
        "parallel": {"micro_batch_size": args.micro_batch, "global_batch_size": args.micro_batch * args.grad_accum,
                     "activation_checkpointing": args.recompute},
        "optimizer": {"lr": 1e-4, "weight_decay": 0.1, "clip_grad": 1.0},
        "data": {"datasets": [{"path": "unused"}], "tokenizer": "unused", "train_samples": 10**6},
        "checkpoint": {"interval_steps": 10**6},
    }, source="bench")


def random_batches(vocab: int, micro_batch: int, seq: int):
    import torch

    generator = torch.Generator().manual_seed(0)
    while True:
        tokens = torch.randint(0, vocab, (micro_batch, seq + 1), generator=generator)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="bloom-1b7")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--recompute", action="store_true", help="activation checkpointing of every layer")
    parser.add_argument("--kernels", choices=["auto", "reference", "triton"], default="auto")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test this script on the CPU")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "train_step_gpu.json")
    args = parser.parse_args(argv)

    import torch

    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if not gpu and not args.allow_cpu:
        print("train_step_gpu: no CUDA GPU here; nothing measured. Run it on a GPU node "
              "(or --allow-cpu for a smoke test of the script).")
        return 0
    if not gpu:
        args.preset, args.seq, args.micro_batch, args.grad_accum, args.steps, args.warmup = "smoke", 32, 2, 2, 2, 1
        os.environ["DS_ACCELERATOR"] = "cpu"

    import kernels
    from trainer.engine import grad_norm, initialize
    from trainer.launch import dist_env_from, init_distributed
    from trainer.metrics import flops_per_iteration
    from trainer.model import build_pipeline_module
    from trainer.parallel.groups import ParallelLayout, initialize_model_parallel

    cfg = bench_cfg(args, gpu)
    init_distributed(dist_env_from({}), cfg.cluster.accelerator)
    kernels.set_kernel_path(args.kernels)
    layout = ParallelLayout()
    initialize_model_parallel(layout)
    torch.manual_seed(1)
    module = build_pipeline_module(cfg, layout)
    params = sum(p.numel() for p in module.parameters())
    engine = initialize(cfg, module, args.grad_accum)
    batches = random_batches(cfg.padded_vocab_size, args.micro_batch, args.seq)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for index in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        loss = engine.train_batch(batches)
        sync()
        if index >= args.warmup:
            times.append(time.perf_counter() - started)
        losses.append(float(loss))
        print(f"step {index}: {times[-1] if index >= args.warmup else time.perf_counter() - started:.3f}s "
              f"loss {losses[-1]:.4f} grad norm {grad_norm(engine)}", flush=True)

    step_s = statistics.median(times)
    global_batch = args.micro_batch * args.grad_accum
    model_tflops = flops_per_iteration(cfg.model_copy(update={"parallel": cfg.parallel.model_copy(
        update={"activation_checkpointing": False})}), global_batch) / step_s / 1e12
    hw_tflops = flops_per_iteration(cfg, global_batch) / step_s / 1e12
    name = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    peak = args.peak_tflops or (peak_for(name) if gpu else None)
    record = {
        "what": "one training step (fwd+bwd+BF16_Optimizer AdamW) through PipelineEngine, 1 GPU",
        "device": name,
        "preset": args.preset,
        "parameters": params,
        "config": {"layers": cfg.model.num_layers, "hidden": cfg.model.hidden_size,
                   "heads": cfg.model.num_attention_heads, "seq": args.seq, "vocab": cfg.padded_vocab_size,
                   "micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "global_batch": global_batch,
                   "recompute": args.recompute, "kernels": kernels.current_path() if gpu else "reference"},
        "step_seconds_median": step_s,
        "step_seconds_all": times,
        "tokens_per_s": global_batch * args.seq / step_s,
        "model_tflops": model_tflops,
        "hardware_tflops": hw_tflops,
        "peak_tflops": peak,
        "mfu": model_tflops / peak if peak else None,
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
        "losses": losses,
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "smoke_test_on_cpu": not gpu,
    }
    print(json.dumps({k: record[k] for k in ("device", "parameters", "step_seconds_median", "tokens_per_s",
                                             "model_tflops", "hardware_tflops", "mfu", "max_memory_gib")}, indent=2))
    if not gpu:
        print("CPU smoke test: the script works; nothing written (the figures mean nothing on a CPU)")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # DeepSpeed's process group threads must not hold the exit
