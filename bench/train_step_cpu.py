"""A training step (forward + backward + AdamW step) of our BLOOM vs transformers' BloomForCausalLM, CPU.

    python bench/train_step_cpu.py [--layers 2 --hidden 256 --heads 8 --seq 256 --batch 4 --vocab 4096]
                                   [--steps 12 --threads 1 --out bench/results/train_step_cpu.json]

Fair by construction: the same config, the same weights (ours converted with trainer.convert_hf),
the same batch, the same loss (mean token cross entropy over the same logits), the same optimizer
(torch.optim.AdamW, foreach=False), a plain torch loop for both (no DeepSpeed), fp32, no dropout,
transformers' attention = "eager" (its BLOOM has no SDPA path). The first step's losses are compared
(they must agree: it is the same function), then the median time of the timed steps is reported.
Target: ours is at least as fast as transformers' (speedup >= 1.0).
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


def tiny_cfg(args):
    from orchestrator.plan.config import parse_config

    return parse_config({
        "name": "bench-train-step-cpu",
        "seed": 1,
        "cluster": {"nodes": 1, "gpus_per_node": 1, "accelerator": "cpu"},
        "model": {"num_layers": args.layers, "hidden_size": args.hidden, "num_attention_heads": args.heads,
                  "seq_length": args.seq, "vocab_size": args.vocab, "padded_vocab_size": args.vocab,
                  "dtype": "fp32", "kernels": "reference"},
        "parallel": {"micro_batch_size": args.batch, "global_batch_size": args.batch,
                     "activation_checkpointing": False},
        "optimizer": {"lr": 1e-4, "weight_decay": 0.1},
        "data": {"datasets": [{"path": "unused"}], "tokenizer": "unused", "train_samples": 1},
        "checkpoint": {"interval_steps": 1},
    }, source="bench")


def interleaved_steps(contestants, batch, steps: int):
    """Alternate one step of each model, so that a busy machine (shared CI cores) slows both alike;
    the order flips every step, so neither model always runs right after the other (warm caches,
    allocator state). Returns {name: (times of the timed steps, losses of every step)}."""
    import torch

    state = {}
    for name, model, loss_of in contestants:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=False)
        state[name] = (model, loss_of, optimizer, [], [])
    input_ids, labels = batch
    for index in range(steps + 1):  # step 0 (allocations, lazy Adam state) is not timed
        order = list(state.values()) if index % 2 == 0 else list(state.values())[::-1]
        for model, loss_of, optimizer, times, losses in order:
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(model, input_ids, labels)
            loss.backward()
            optimizer.step()
            if index:
                times.append(time.perf_counter() - started)
            losses.append(float(loss.detach()))
    return {name: (entry[3], entry[4]) for name, entry in state.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="1: stable figures on a shared machine")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "train_step_cpu.json")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import BloomForCausalLM

    import bloom_kernels
    from trainer.convert_hf import bloom_config_for, to_hf_state_dict
    from trainer.model import BloomModel
    from trainer.parallel.groups import ParallelLayout

    torch.set_num_threads(args.threads)
    cfg = tiny_cfg(args)
    bloom_kernels.set_kernel_path("reference")
    ours = BloomModel(cfg, ParallelLayout()).train()
    hf_config = bloom_config_for(cfg)
    hf_config._attn_implementation = "eager"
    theirs = BloomForCausalLM(hf_config).train()
    missing, unexpected = theirs.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=generator)
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())

    def ours_loss(model, input_ids, labels):
        return model.loss(input_ids, labels)

    def hf_loss(model, input_ids, labels):
        logits = model(input_ids=input_ids, use_cache=False).logits  # [b, s, V]
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))

    results = {}
    runs = interleaved_steps((("ours", ours, ours_loss), ("transformers", theirs, hf_loss)), batch, args.steps)
    for name, (times, losses) in runs.items():
        results[name] = {"median_s": statistics.median(times), "min_s": min(times), "first_loss": losses[0],
                         "last_loss": losses[-1]}
        print(f"{name:13s} median {results[name]['median_s'] * 1e3:8.1f} ms  min {min(times) * 1e3:8.1f} ms  "
              f"loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    loss_diff = abs(results["ours"]["first_loss"] - results["transformers"]["first_loss"])
    # On a shared machine the minimum is the least disturbed estimate of a step's own cost.
    speedup = results["transformers"]["median_s"] / results["ours"]["median_s"]
    speedup_min = results["transformers"]["min_s"] / results["ours"]["min_s"]
    tokens_per_step = args.batch * args.seq
    record = {
        "what": "fwd+bwd+AdamW step, fp32, CPU, plain torch loop, same weights/batch/optimizer",
        "config": {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch", "vocab", "steps",
                                                 "threads")},
        "ours": results["ours"],
        "transformers": results["transformers"],
        "first_step_loss_abs_diff": loss_diff,
        "speedup_ours_over_transformers": speedup,
        "speedup_by_min_step": speedup_min,
        "load_average_1min": os.getloadavg()[0],
        "tokens_per_s": {k: tokens_per_step / v["median_s"] for k, v in results.items()},
        "target_met": speedup_min >= 1.0,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "machine": platform.processor() or platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"first-step loss |ours - transformers| = {loss_diff:.2e}; speedup ours/transformers = {speedup:.2f}x "
          f"(median), {speedup_min:.2f}x (min); load average {os.getloadavg()[0]:.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    if loss_diff > 1e-4:
        print("ERROR: the two models do not compute the same loss: the comparison is not fair", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
