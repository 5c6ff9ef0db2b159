"""Checkpoints verified by what they compute: a probe batch's loss and logits, at save and at load.

A checkpoint's hashes prove its bytes are the bytes that were written, not that the state computes
what the run computed: a bit flipped in memory before the write is hashed faithfully. So at each
save the model being saved evaluates a fixed probe batch and `probe.json` (covered by the manifest)
records its loss, the sha256 of its logits and a sample of logit values. After a load, before any
step, the restored model evaluates the same batch and the trainer compares (trainer/loop.py): a
mismatch makes the checkpoint damaged, reported like a hash failure (checkpoints/damaged.jsonl,
with the manifest's sha256 so that this exact checkpoint is skipped from then on), and the resume
falls back to the one before. Nothing is deleted.

The probe batch: the first `micro_batch_size` samples (positions 0..mbs-1) of the validation
split, or of the training split when there is none; one micro-batch per DP replica, every replica
the same samples, in eval mode (no dropout), with every RNG state put back afterwards, so that a
probe changes nothing of the run (exact resume stays bit-exact).

What "the same" means:
- bitwise (loss and logits sha256) when the layout (tp, pp, dp), the kernel path, the attention
  implementation, the dtype and the device type are those of the save and the device is the CPU
  (deterministic kernels);
- otherwise (another layout through a universal checkpoint, or a GPU) within a tolerance: the loss
  within LOSS_ATOL + LOSS_RTOL x |loss| and each sampled logit within LOGIT_ATOL + LOGIT_RTOL x |v|.
  Another layout sums bf16 partial results in another order (TP all-reduces), which moves logits
  by a few bf16 ulps; a corrupted weight moves them by far more. The tolerances are wide enough for
  the former (the universal-resume test measures it) and a bit flip in a mantissa's low bits can
  hide under them: only the bitwise check sees those.
The DP replicas hold the same weights and evaluate the same samples: their logits must agree
bitwise at the save and at the load too (a replica that disagrees is silent data corruption).

With BF16_Optimizer the model computes with bf16 weights derived from the fp32 master. DeepSpeed
loads the bf16 copy from its own file, so before the probe runs the loader re-derives the bf16
weights from the loaded fp32 master (`refresh_model_from_master`), as the next optimizer step
would: the probe then checks the master the run will continue from, and the bits are unchanged
when nothing is wrong (the bf16 copy is always the cast of the master after a step).

Measured: across layouts ((tp, pp, dp) = (1, 2, 2) saved, (2, 1, 2) loaded through the universal
checkpoint, tests/trainer/test_trainer_universal_resume.py) the probe loss moved by 3.8e-5 and the
sampled logits by at most 4.9e-4, far inside the tolerances; the corruption of the fault
`corruptmaster` (256 fp32 master weights + 1.0) moved the loss by 6e-4: caught bitwise, but it
would pass the cross-layout tolerance (a load at another layout catches gross corruption only).

Cost: one forward micro-batch through the pipeline, at save and at load, logged as `probe ... in
X s`: at the demo size (configs/demo-cpu-4node.yaml: 4 layers, h 64, seq 64, tp 2 x pp 2 on a
2-core CPU) 0.05-0.08 s at a save (of a 0.13-0.16 s save, probe included) and 0.09 s at a load.
BLOOM estimate (mbs 2 x 2048 tokens, 2 x 176e9 FLOPs per token = 1.4 PFLOP, 12 stages of 4 GPUs at
~150 TFLOPs): ~0.2 s per stage, ~2.5 s through the pipeline, plus hashing each last-stage rank's
~0.5 GB of bf16 logits (~1 s): ~3-4 s per save and per load, against a save of minutes every 3 h.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.contract import PROBE_NAME

VERSION = 1
LOSS_ATOL, LOSS_RTOL = 0.02, 0.005
LOGIT_ATOL, LOGIT_RTOL = 0.05, 0.02
SAMPLED_POSITIONS = 3  # first, middle and last position of each probe sample
SAMPLED_VOCAB = 16  # evenly spaced token ids of the (unpadded) vocabulary


def probe_dataset(train, valid):
    """(name, dataset) the probe reads from."""
    return ("valid", valid) if valid is not None else ("train", train)


def _sample_coordinates(rows: int, seq: int, vocab: int) -> list[tuple[int, int, int]]:
    positions = sorted({0, seq // 2, seq - 1})[:SAMPLED_POSITIONS]
    ids = sorted({round(i * (vocab - 1) / (SAMPLED_VOCAB - 1)) for i in range(SAMPLED_VOCAB)})
    return [(b, p, v) for b in range(rows) for p in positions for v in ids]


def _setup(cfg, layout) -> dict[str, Any]:
    import bloom_kernels

    device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
    return {"layout": {"tp": layout.tp, "pp": layout.pp, "dp": layout.dp}, "kernels": bloom_kernels.current_path(device),
            "attention": bloom_kernels.current_attention_impl(device), "dtype": cfg.model.dtype, "device": device}


def compute_probe(engine, cfg, layout, dataset_name: str, dataset) -> dict[str, Any]:
    """Collective (every rank): the probe record of the model as it is now, the same on every rank."""
    import torch.distributed as tdist

    from trainer import checkpoint as ckpt
    from trainer.checkpoint_format import gather_to_all

    mbs = cfg.parallel.micro_batch_size
    text = torch.from_numpy(np.stack([dataset[i]["text"] for i in range(mbs)]))  # [mbs, seq + 1]
    batch = (text[:, :-1].contiguous(), text[:, 1:].contiguous())
    saved_rng = ckpt.rng_state()
    started = time.time()
    try:
        loss, logits = engine.eval_batch(iter([batch]), return_logits=True, num_micro_batches=1)
    finally:
        ckpt.set_rng_state(saved_rng)
    mine = None
    if engine.is_last_stage():
        local = logits.detach()  # [mbs, seq, V/tp], the model's dtype, on its device
        tp_rank = layout.coords_of(tdist.get_rank() if tdist.is_initialized() else 0)[0]
        first_id = tp_rank * local.shape[-1]
        sampled = {}
        for b, p, v in _sample_coordinates(mbs, cfg.model.seq_length, cfg.model.vocab_size):
            if first_id <= v < first_id + local.shape[-1]:
                sampled[(b, p, v)] = float(local[b, p, v - first_id])
        # Only the real vocabulary (the padding columns depend on tp); the bytes as they are (no
        # fp32 copy: at BLOOM's size one rank's slice is ~0.5 GB of bf16).
        real = local[..., : max(0, min(local.shape[-1], cfg.model.vocab_size - first_id))].contiguous()
        raw = real.cpu().view(torch.uint8).numpy()
        mine = {"digest": hashlib.sha256(raw.tobytes()).hexdigest(), "sampled": sampled}
    rank = tdist.get_rank() if tdist.is_initialized() else 0
    everyone = gather_to_all((layout.coords_of(rank), mine))
    by_replica: dict[int, list[tuple[int, dict]]] = {}
    for (tp_rank, dp_rank, _), part in everyone:
        if part is not None:
            by_replica.setdefault(dp_rank, []).append((tp_rank, part))
    digests = {}
    for dp_rank, parts in by_replica.items():
        joined = hashlib.sha256()
        for _, part in sorted(parts, key=lambda item: item[0]):
            joined.update(part["digest"].encode())
        digests[dp_rank] = joined.hexdigest()
    sampled = {}
    for _, part in by_replica[0]:
        sampled.update(part["sampled"])
    return {
        "version": VERSION, "dataset": dataset_name, "samples": [0, mbs], **_setup(cfg, layout),
        "loss": float(loss), "logits_sha256": digests[0],
        "replica_logits_sha256": [digests[d] for d in sorted(digests)],
        "logits_sample": [[b, p, v, sampled[(b, p, v)]] for b, p, v in sorted(sampled)],
        "seconds": time.time() - started,
    }


def probe_file_record(probe: dict[str, Any]) -> dict[str, Any]:
    """What probe.json holds: the probe without its timing (two saves of the same state must write
    the same bytes: the exact-resume tests compare checkpoints file by file)."""
    return {k: v for k, v in probe.items() if k != "seconds"}


def read_probe(ckpt_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(ckpt_dir) / PROBE_NAME).read_text())
    except FileNotFoundError:
        return None


def compare(recorded: dict[str, Any], now: dict[str, Any]) -> tuple[str, list[str]]:
    """(how it was compared: "bitwise" | "tolerance" | "not comparable", problems; empty = same)."""
    problems = []
    if len(set(now["replica_logits_sha256"])) > 1:
        problems.append(f"the DP replicas compute different logits from the same weights: "
                        f"{now['replica_logits_sha256']}")
    if (recorded.get("dataset"), recorded.get("samples")) != (now["dataset"], now["samples"]):
        return "not comparable", problems
    same_setup = all(recorded.get(k) == now[k] for k in ("layout", "kernels", "attention", "dtype", "device"))
    if same_setup and now["device"] == "cpu":
        if recorded.get("loss") != now["loss"]:
            problems.append(f"probe loss {now['loss']!r} != {recorded.get('loss')!r} recorded at the save (bitwise)")
        if recorded.get("logits_sha256") != now["logits_sha256"]:
            problems.append("probe logits differ from those recorded at the save (sha256, bitwise)")
        return "bitwise", problems
    loss, then = now["loss"], recorded.get("loss")
    if not isinstance(then, (int, float)) or not math.isfinite(loss) or \
            abs(loss - then) > LOSS_ATOL + LOSS_RTOL * abs(then):
        problems.append(f"probe loss {loss:.6g} vs {then!r} recorded at the save: beyond the tolerance "
                        f"{LOSS_ATOL} + {LOSS_RTOL} x |loss|")
    recorded_values = {(b, p, v): x for b, p, v, x in recorded.get("logits_sample", [])}
    worst, where = 0.0, None
    for b, p, v, x in now["logits_sample"]:
        if (b, p, v) in recorded_values:
            then_x = recorded_values[(b, p, v)]
            excess = abs(x - then_x) - (LOGIT_ATOL + LOGIT_RTOL * abs(then_x))
            if excess > worst or not math.isfinite(x):
                worst, where = max(excess, worst), (b, p, v, then_x, x)
    if where is not None:
        b, p, v, then_x, x = where
        problems.append(f"probe logit [sample {b}, position {p}, token {v}] = {x:.6g} vs {then_x:.6g} recorded: "
                        f"beyond the tolerance {LOGIT_ATOL} + {LOGIT_RTOL} x |v|")
    return "tolerance", problems


def max_differences(recorded: dict[str, Any], now: dict[str, Any]) -> tuple[float, float]:
    """(|loss difference|, max |sampled logit difference|): for logs and the layout tolerance."""
    recorded_values = {(b, p, v): x for b, p, v, x in recorded.get("logits_sample", [])}
    diffs = [abs(x - recorded_values[(b, p, v)]) for b, p, v, x in now["logits_sample"] if (b, p, v) in recorded_values]
    return abs(now["loss"] - recorded.get("loss", math.nan)), max(diffs, default=0.0)


def refresh_model_from_master(engine) -> None:
    """Collective over DP: the bf16 weights re-derived from the loaded fp32 master (BF16_Optimizer's
    own update after a step). An fp32 model computes with its master: nothing to do."""
    if getattr(engine, "using_bf16_optimizer", False):
        engine.optimizer.update_lp_params()
