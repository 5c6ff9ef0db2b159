"""The work of the auxiliary jobs (`runctl preprocess | convert | export-hf | eval | sdc-check`), one function
each, run inside the SLURM job (or the local subprocess) that orchestrator.operate.auxjobs submits with
submitit. Each takes plain values and returns a small JSON-able dict: that dict is what the
controller's events.jsonl records as the job's result.

    preprocess(inputs, output_prefix, tokenizer)  -> {"documents", "tokens", "output_prefix", ...}
    convert(run_dir, step)                          -> {"checkpoint", "output"}
    export_hf(run_dir, step, output)                -> {"checkpoint", "output", "parameters"}
    evaluate(run_dir, step)                         -> {"checkpoint", "loss", "perplexity", "samples", "tokens"}
    sdc_check(run_dir, step, steps)                 -> {"match", "first_mismatch", "mismatched_steps", ...}

export-hf and eval read a checkpoint of ANY (tp, pp, dp) layout through its universal checkpoint
(trainer.universal: TP slices merged, fp32 master weights), converting it first when it is not
there: one reader for every layout, and the weights are the optimizer's fp32 masters. The model
they build is the trainer's own BloomModel (tp = 1, one process), on the trainer's validation
split (trainer.loop.build_datasets): the same samples the trainer's in-run evaluation uses.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.contract import RunPaths


def preprocess(inputs: list[str], output_prefix: str, tokenizer: str, workers: int = 1,
               json_key: str = "text") -> dict[str, Any]:
    """Tokenise `inputs` into `<output_prefix>.bin/.idx` (trainer.data.preprocess)."""
    from trainer.data.preprocess import preprocess as tokenise

    stats = tokenise(inputs, output_prefix, tokenizer, workers=workers, json_key=json_key, quiet=True)
    return {**stats, "output_prefix": str(output_prefix)}


def _run_paths(run_dir: str) -> tuple[Any, RunPaths]:
    from orchestrator.plan.config import load_config

    cfg = load_config(RunPaths.of(run_dir).config)
    return cfg, RunPaths.of(run_dir, cfg.checkpoint.dir)


def _checkpoint(paths: RunPaths, step: int | None) -> Path:
    """checkpoints/step_N, or the one `latest` names."""
    if step is not None:
        source = paths.checkpoint(step)
    else:
        if not paths.latest.exists():
            raise FileNotFoundError(f"{paths.latest} does not exist: the run has no complete checkpoint; pass --step N")
        source = paths.checkpoints / paths.latest.read_text().strip()
    if not source.is_dir():
        raise FileNotFoundError(f"no checkpoint {source}: pick a step from `ls {paths.checkpoints}`")
    return source


def convert(run_dir: str, step: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """checkpoints/step_N -> checkpoints/step_N_universal (trainer.universal)."""
    from trainer.universal import convert_to_universal

    _, paths = _run_paths(run_dir)
    source = _checkpoint(paths, step)
    output = convert_to_universal(source, overwrite=overwrite)
    return {"checkpoint": source.name, "output": str(output)}


def _universal_of(source: Path) -> Path:
    """The universal checkpoint of `source`, made now when there is none yet; an existing one
    must verify (owner, hashes) before its files are unpickled (full_model_state)."""
    from trainer.checkpoint_format import UNIVERSAL_SUFFIX, require_verified
    from trainer.universal import convert_to_universal, is_universal

    if is_universal(source):
        return require_verified(source)
    universal = source.with_name(source.name + UNIVERSAL_SUFFIX)
    if is_universal(universal):
        return require_verified(universal)
    return convert_to_universal(source)  # verifies the source first; writes a fresh manifest


def full_model_state(universal: Path, num_layers: int) -> dict[str, Any]:
    """Our BloomModel's full (tp = 1) state dict, fp32, from a universal checkpoint's
    zero/<pipeline parameter name>/fp32.pt files (DeepSpeed's format, pickled: the caller has
    verified `universal` against its manifest, _universal_of)."""
    import torch

    from trainer.convert_hf import model_state_from_pipeline

    pipe_state = {}
    for folder in sorted((universal / "zero").iterdir()):
        fp32 = folder / "fp32.pt"
        if fp32.is_file():
            pipe_state[folder.name] = torch.load(fp32, map_location="cpu", weights_only=False)["param"]
    if not pipe_state:
        raise ValueError(f"{universal}/zero holds no fp32.pt: not a universal checkpoint")
    return model_state_from_pipeline(pipe_state, num_layers)


def _with_vocab_of(cfg, state: dict[str, Any]):
    """The config with the checkpoint's padded vocabulary (the saving layout's padding)."""
    rows = state["embedding.word_embeddings.weight"].shape[0]
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"padded_vocab_size": rows})})


def export_hf(run_dir: str, step: int | None, output: str, vocab_size: int | None = None) -> dict[str, Any]:
    """A checkpoint -> a transformers BloomForCausalLM save_pretrained directory (trainer.convert_hf)."""
    cfg, paths = _run_paths(run_dir)
    source = _checkpoint(paths, step)
    from transformers import BloomForCausalLM

    from trainer.convert_hf import bloom_config_for, to_hf_state_dict

    state = full_model_state(_universal_of(source), cfg.model.num_layers)
    cfg = _with_vocab_of(cfg, state)
    model = BloomForCausalLM(bloom_config_for(cfg, vocab_size=vocab_size))
    model.load_state_dict(to_hf_state_dict(state, vocab_size=vocab_size))
    model.save_pretrained(output)
    return {"checkpoint": source.name, "output": str(output),
            "parameters": sum(p.numel() for p in model.parameters())}


def evaluate(run_dir: str, step: int | None = None) -> dict[str, Any]:
    """Mean token loss and perplexity of a checkpoint on the trainer's fixed validation samples
    (trainer.loop.eval_samples: eval_iters global batches), in the run's dtype."""
    cfg, paths = _run_paths(run_dir)
    source = _checkpoint(paths, step)  # before the heavy imports: a wrong step fails in a second
    import torch

    from trainer.data import build_data_loader
    from trainer.loop import build_datasets, eval_samples, pipe_batches
    from trainer.model import BloomModel

    state = full_model_state(_universal_of(source), cfg.model.num_layers)
    cfg = _with_vocab_of(cfg, state)
    dtype = torch.bfloat16 if cfg.model.dtype == "bf16" else torch.float32
    model = BloomModel(cfg, params_dtype=dtype)
    model.load_state_dict(state)  # copies (and rounds) the fp32 masters into the run's dtype
    use_gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    device = torch.device("cuda") if use_gpu else torch.device("cpu")
    model.to(device).eval()
    _, valid = build_datasets(cfg, paths, rank=0)
    wanted = eval_samples(cfg)
    if valid is None or not wanted:
        raise ValueError(f"data.split={cfg.data.split!r} / data.eval_iters={cfg.data.eval_iters} leave no "
                         "validation samples: nothing to evaluate")
    micro = cfg.parallel.micro_batch_size
    loader = build_data_loader(valid, 0, micro, 0, 1)
    loss_sum, batches = 0.0, 0
    with torch.no_grad():
        for input_ids, labels in pipe_batches(loader):
            if batches * micro >= wanted:
                break
            loss_sum += float(model.loss(input_ids.to(device), labels.to(device)))  # every micro-batch has micro x seq tokens
            batches += 1
    loss = loss_sum / batches
    return {"checkpoint": source.name, "loss": loss, "perplexity": math.exp(loss), "samples": batches * micro,
            "tokens": batches * micro * cfg.model.seq_length, "dtype": cfg.model.dtype, "device": device.type, "host": os.uname().nodename}


def _replay_env(rank: int, world: int, port: int) -> dict[str, str]:
    """A replay rank's environment: torchrun's variables (trainer.launch), none of the aux job's
    own SLURM ones (one task of its own, which the ranks must not take for their layout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port))
    return env


def sdc_check(run_dir: str, step: int, steps: int = 1, timeout_seconds: float = 3600.0) -> dict[str, Any]:
    """`python -m trainer.replay` at the run's own layout: its world size of ranks on this node (one
    GPU each on a GPU cluster), each logging to reports/replay-step_S-kK-rank-R.log; the full
    result in reports/replay-step_S-kK.json; returned: the verdict and what names the mismatch
    (small: it goes to events.jsonl). A replay that could not run raises, with rank 0's last lines."""
    from trainer.launch import free_port

    cfg, paths = _run_paths(run_dir)
    if not paths.checkpoint(step).is_dir():
        raise FileNotFoundError(f"no checkpoint {paths.checkpoint(step)}: pick a step from `ls {paths.checkpoints}`")
    world, report = cfg.world_size, paths.replay_report(step, steps)
    paths.reports.mkdir(parents=True, exist_ok=True)
    report.unlink(missing_ok=True)
    port, procs = free_port(), []
    for rank in range(world):
        with open(paths.replay_log(step, steps, rank), "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "trainer.replay", str(paths.root), "--step", str(step), "--steps", str(steps),
                 "--output", str(report)],
                env=_replay_env(rank, world, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout_seconds
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    codes = [p.returncode for p in procs]
    if not report.is_file() or codes[0] not in (0, 3):  # trainer.replay: 0 match, 3 mismatch
        tail = paths.replay_log(step, steps, 0).read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"the replay ranks exited {codes} without a result; rank 0's last lines:\n" + "\n".join(tail))
    full = json.loads(report.read_text())
    first = full.get("first_mismatch")
    return {  # not a beat or event: trainer.replay's result
        "checkpoint": full["checkpoint"], "steps_replayed": full["steps_replayed"], "comparison": full["comparison"],
        "layout": full["layout"], "match": full["match"], "probe_problems": full["probe_problems"],
        "mismatched_steps": [row["step"] for row in full["per_step"] if row["match"] is False],
        "first_mismatch": None if first is None else {
            "step": first["step"], "differ": first["differ"],
            "dp_replicas": [{"dp_replica": r["dp_replica"], "ranks": r["ranks"]} for r in first["dp_replicas"]],
        },
        "report": str(report), "exit_codes": codes,
    }


TASKS = {"preprocess": preprocess, "convert": convert, "export-hf": export_hf, "eval": evaluate,
         "sdc-check": sdc_check}
