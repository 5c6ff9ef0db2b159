"""Achieved TFLOPs and MFU of a training step of a 1B-class BLOOM on one GPU, through the real trainer
path, beside transformers' BloomForCausalLM + torch.optim.AdamW at the same batch, in the same run,
and a torch.profiler pass over our step.

    python bench/train_step_gpu.py [--preset bloom-1b7] [--micro-batch 4 --grad-accum 4 --seq 2048]
                                   [--recompute] [--kernels auto] [--steps 10] [--baseline-steps 5]
                                   [--profile-steps 2] [--out bench/results/train_step_gpu.json]

In this order (the baseline first: plain torch objects, freed before our engine takes the memory):
1. transformers: BloomForCausalLM with torch.optim.AdamW as the Trainer runs it with bf16=True
   (bench/train_step_baseline.py), same micro-batch, accumulation and sequence;
2. ours: the trainer's step, our BLOOM PipelineModule in DeepSpeed's PipelineEngine, bf16 weights,
   BF16_Optimizer (fp32 master + fp32 gradient accumulation, ZeRO-1), AdamW, clipping; kernels as
   bloom_kernels/dispatch.py picks them (the decisions are recorded); random tokens;
3. torch.profiler over --profile-steps more of our steps: the summary (top kernels by device time,
   time by kind) goes to <out stem>_profile.md, its head into the JSON (bench/step_profile.py).
Model FLOPs per iteration, for both (the same architecture): every matmul of forward and backward,
    tokens * (72 l h^2 + 12 l h s + 6 h V)      (PaLM, Chowdhery et al. 2022, appendix B: 6N + 12lhs)
    i.e. 6 FLOPs per weight per token (fwd 2, bwd 4), causal attention counted in full. Megatron's
    72 B s l h^2 (1 + s/6h + V/16lh) (orchestrator.plan.planner, BLOOM's papers) is also recorded: it is
    derived with recompute (96 ...) and, scaled to 72, counts the logits as 4.5 h V instead of 6 h V
    (7% low at bloom-1b7's V/(16 l h) = 0.32; 0.4% at bloom-176b).
MFU = model TFLOP/s / the GPU's dense bf16 peak (bench/device_peaks.py; H200: 989, or --peak-tflops).
Hardware FLOPs with --recompute add one forward of the layers (96 instead of 72 in the l h^2 terms).

Without a GPU it prints a message and exits 0; `--allow-cpu` runs the whole path on a tiny config
on the CPU instead (its numbers mean nothing; written only where --out says).
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

from bench.device_peaks import SOURCE as PEAKS_SOURCE  # noqa: E402
from bench.device_peaks import peak_bf16_tflops  # noqa: E402

# (layers, hidden, heads): the BLOOM family's 1B-class members.
PRESETS = {"bloom-1b1": (24, 1536, 16), "bloom-1b7": (24, 2048, 16), "smoke": (2, 64, 4)}
FLOPS_FORMULA = "tokens * (72 l h^2 + 12 l h s + 6 h V): every matmul, fwd + bwd (PaLM appendix B)"


def model_flops_per_iteration(layers: int, hidden: int, seq: int, vocab: int, global_batch: int,
                              recompute: bool = False) -> float:
    """FLOPs of all matmuls of one iteration (see the module docstring); with recompute, the
    layers' forward once more (hardware FLOPs)."""
    layer_terms = (96 if recompute else 72) * layers * hidden**2 + (16 if recompute else 12) * layers * hidden * seq
    return global_batch * seq * (layer_terms + 6 * hidden * vocab)


def rates(step_seconds: float, flops: float, peak: float | None, tokens: int) -> dict:
    tflops = flops / step_seconds / 1e12
    return {"tokens_per_s": tokens / step_seconds, "model_tflops": tflops, "mfu": tflops / peak if peak else None}


def bench_cfg(args, gpu: bool):
    from orchestrator.plan.config import parse_config

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
    parser.add_argument("--baseline-steps", type=int, default=5, help="timed steps of the transformers baseline (0: skip)")
    parser.add_argument("--profile-steps", type=int, default=2, help="steps under torch.profiler (0: skip)")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--allow-cpu", action="store_true", help="smoke-test this script on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="default on a GPU: bench/results/train_step_gpu.json")
    args = parser.parse_args(argv)

    import torch

    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if not gpu and not args.allow_cpu:
        print("train_step_gpu: no CUDA GPU here; nothing measured. Run it on a GPU node "
              "(or --allow-cpu for a smoke test of the script).")
        return 0
    if not gpu:
        args.preset, args.seq, args.micro_batch, args.grad_accum = "smoke", 32, 2, 2
        args.steps, args.warmup = 1, 1
        args.baseline_steps, args.profile_steps = min(args.baseline_steps, 1), min(args.profile_steps, 1)
        os.environ["DS_ACCELERATOR"] = "cpu"
    out = args.out or (REPO / "bench" / "results" / "train_step_gpu.json" if gpu else None)

    import bloom_kernels
    from bench.step_profile import profile_steps, summarise, write_summary
    from bench.train_step_baseline import run_transformers_baseline
    from bloom_kernels import dispatch
    from trainer.engine import grad_norm, initialize
    from trainer.launch import dist_env_from, init_distributed
    from trainer.metrics import flops_per_iteration as megatron_flops
    from trainer.model import build_pipeline_module
    from trainer.parallel.groups import ParallelLayout, initialize_model_parallel

    cfg = bench_cfg(args, gpu)
    layers, hidden, heads = PRESETS[args.preset]
    vocab, global_batch = cfg.padded_vocab_size, args.micro_batch * args.grad_accum
    tokens = global_batch * args.seq
    name = torch.cuda.get_device_name() if gpu else platform.processor() or "cpu"
    peak = args.peak_tflops or (peak_bf16_tflops(name) if gpu else None)
    flops = model_flops_per_iteration(layers, hidden, args.seq, vocab, global_batch)
    record = {
        "what": "one training step: ours (fwd+bwd+BF16_Optimizer AdamW through PipelineEngine) beside transformers' "
                "BloomForCausalLM + torch.optim.AdamW, same batch, same run, 1 device",
        "device": name, "preset": args.preset,
        "config": {"layers": layers, "hidden": hidden, "heads": heads, "seq": args.seq, "vocab": vocab,
                   "micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "global_batch": global_batch,
                   "recompute": args.recompute},
        "peak_tflops": peak, "peak_source": PEAKS_SOURCE if peak and not args.peak_tflops else "--peak-tflops",
        "model_flops_per_iteration": flops, "flops_formula": FLOPS_FORMULA,
        "megatron_formula_flops_per_iteration": megatron_flops(cfg.model_copy(update={"parallel": cfg.parallel.model_copy(
            update={"activation_checkpointing": False})}), global_batch),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda},
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "smoke_test_on_cpu": not gpu,
    }

    def write() -> None:  # after every part: a run stopped at its time limit keeps what it measured
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=2) + "\n")

    batches = random_batches(vocab, args.micro_batch, args.seq)
    if args.baseline_steps:
        try:
            baseline = run_transformers_baseline(layers, hidden, heads, vocab, args.seq, args.micro_batch,
                                                 args.grad_accum, args.baseline_steps, 1, gpu, batches)
            baseline.update(rates(baseline["step_seconds_median"], flops, peak, tokens))
        except torch.OutOfMemoryError as exc:
            baseline = {"error": f"out of memory at this batch: {str(exc).splitlines()[0]}"}
            torch.cuda.empty_cache()
        record["transformers"] = baseline
        print("transformers baseline:", json.dumps({k: v for k, v in baseline.items() if k not in ("step_seconds_all",)}),
              flush=True)
        write()

    init_distributed(dist_env_from({}), cfg.cluster.accelerator)
    bloom_kernels.set_kernel_path(args.kernels)
    layout = ParallelLayout()
    initialize_model_parallel(layout)
    torch.manual_seed(1)
    module = build_pipeline_module(cfg, layout)
    params = sum(p.numel() for p in module.parameters())
    engine = initialize(cfg, module, args.grad_accum)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for index in range(args.warmup + args.steps):
        sync()
        started = time.perf_counter()
        loss = engine.train_batch(batches)
        sync()
        took = time.perf_counter() - started
        if index >= args.warmup:
            times.append(took)
        losses.append(float(loss))
        print(f"step {index}: {took:.3f}s loss {losses[-1]:.4f} grad norm {grad_norm(engine)}", flush=True)

    step_s = statistics.median(times)
    record["ours"] = {
        "parameters": params, "step_seconds_median": step_s, "step_seconds_all": times,
        **rates(step_s, flops, peak, tokens),
        "hardware_tflops": model_flops_per_iteration(layers, hidden, args.seq, vocab, global_batch,
                                                     args.recompute) / step_s / 1e12,
        "megatron_formula_tflops": record["megatron_formula_flops_per_iteration"] / step_s / 1e12,
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
        "losses": losses, "kernel_path": bloom_kernels.current_path() if gpu else "reference",
        "kernel_decisions": dispatch.decisions(),
    }
    if "step_seconds_median" in record.get("transformers", {}):
        record["speedup_vs_transformers"] = record["transformers"]["step_seconds_median"] / step_s
    write()

    if args.profile_steps:
        prof = profile_steps(lambda: engine.train_batch(batches), args.profile_steps, gpu)
        summary = summarise(prof, gpu, args.profile_steps)
        record["profile"] = {"clock": summary["clock"], "total_ms_per_step": summary["total_ms_per_step"],
                             "by_kind_ms_per_step": summary["by_kind_ms_per_step"], "top": summary["top"][:10]}
        if out is not None:
            summary_path = out.with_name(out.stem + "_profile.md")
            write_summary(summary_path, summary, f"Profile of our {args.preset} step on {name}")
            record["profile"]["summary_file"] = str(summary_path.relative_to(REPO) if summary_path.is_relative_to(REPO)
                                                    else summary_path)
        write()
    shown = {k: record["ours"][k] for k in ("step_seconds_median", "tokens_per_s", "model_tflops", "mfu", "max_memory_gib")}
    print(json.dumps({"device": name, "ours": shown, "speedup_vs_transformers": record.get("speedup_vs_transformers"),
                      "profile_by_kind_ms": record.get("profile", {}).get("by_kind_ms_per_step")}, indent=2))
    print(f"wrote {out}" if out else "CPU smoke test: the script works; nothing written (no --out)")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # DeepSpeed's process group threads must not hold the exit
