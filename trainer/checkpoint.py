"""Checkpoints under `checkpoints/step_NNNNNNN/`: DeepSpeed's files, ours, a MANIFEST, `latest`.

`checkpoints/` is the config's `checkpoint.dir` (relative to the run directory, or absolute, e.g. a
scratch filesystem): `RunPaths.of(run_dir, cfg.checkpoint.dir).checkpoints`, the one rule the
controller and the dashboard use too. The manifest helpers are trainer.checkpoint_format's.

Save (every rank calls it; collective):
1. `engine.save_checkpoint(checkpoints/, tag=step_N, client_state=...)`: DeepSpeed's model and
   optimizer files (bf16 weights, fp32 master partitions, Adam moments) plus our client state
   (step, consumed samples, LR samples, rampup batch, schedule parameters).
2. `rng/rank-NNNNN.pt` per rank: python/numpy/torch RNG states (differ per rank: dropout).
3. barrier; the file list is hashed in parallel (file i by rank i % world), gathered on rank 0,
   which writes MANIFEST.json (every file, size, sha256) LAST, atomically, then points `latest`
   at the new checkpoint (atomic rename), then applies keep-last-N.

A checkpoint without a MANIFEST is not a checkpoint (a save that died half way). Resume takes the
newest `step_*` not newer than `latest` whose manifest verifies; a damaged one is skipped, reported
on stderr and in `checkpoints/damaged.jsonl`, and never deleted. Cleanup deletes only complete,
non-damaged checkpoints older than the newest `keep_last` complete ones, never the one `latest`
names, so it can never delete the only good checkpoint.
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.protocol import (  # noqa: F401 - verify_manifest, read_json: used via this module
    CHECKPOINT_NAME_FORMAT,
    DAMAGED_LOG_NAME,
    MANIFEST_NAME,
    RunPaths,
    append_jsonl,
    atomic_write_text,
    read_json,
    read_jsonl,
    resume_candidates,
    step_of,
    verify_manifest,
)
from trainer.checkpoint_format import (  # noqa: F401 - re-exported: the manifest helpers
    UNIVERSAL_SUFFIX,
    dist_barrier,
    dist_world,
    gather_to_all,
    hash_files_shared,
    list_files,
    verify_shared,
    write_manifest,
)

DAMAGED_LOG = DAMAGED_LOG_NAME
CLIENT_STATE_KEY = "trainer"


# -- latest / listing ------------------------------------------------------------------------
def read_latest(paths: RunPaths) -> str | None:
    try:
        name = paths.latest.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return name or None


def write_latest(paths: RunPaths, name: str) -> None:
    atomic_write_text(paths.latest, name + "\n")


def complete_checkpoints(paths: RunPaths) -> list[tuple[int, Path]]:
    """(step, dir) of every step_* that has a manifest, oldest first."""
    found = []
    if paths.checkpoints.is_dir():
        for child in paths.checkpoints.iterdir():
            step = step_of(child.name)
            if step is not None and child.is_dir() and (child / MANIFEST_NAME).exists():
                found.append((step, child))
    return sorted(found)


def damaged_names(paths: RunPaths) -> set[str]:
    return {r.get("checkpoint", "") for r in read_jsonl(paths.damaged)}


def report_damaged(paths: RunPaths, ckpt_dir: Path, problems: list[str], job_id: str) -> None:
    print(f"[checkpoint] SKIPPING damaged checkpoint {ckpt_dir.name}: {'; '.join(problems[:5])}", file=sys.stderr,
          flush=True)
    append_jsonl(paths.damaged, {
        "checkpoint": ckpt_dir.name, "problems": problems[:20], "time": time.time(), "job_id": job_id,
    })


def find_resume_checkpoint(paths: RunPaths, job_id: str = "") -> Path | None:
    """Newest complete checkpoint not newer than `latest` whose manifest verifies (collective).
    The candidates and their order are the contract's (orchestrator.protocol.resume_candidates),
    which the controller uses to predict the same choice."""
    rank, _ = dist_world()
    # Rank 0's view for everyone: a lagging shared filesystem must not make ranks diverge.
    candidates = gather_to_all([str(d) for d in resume_candidates(paths.checkpoints)])[0]
    for ckpt_name in candidates:
        ckpt_dir = Path(ckpt_name)
        problems = verify_shared(ckpt_dir)
        if not problems:
            return ckpt_dir
        if rank == 0:
            report_damaged(paths, ckpt_dir, problems, job_id)
    return None


def saved_layout(ckpt_dir: Path) -> dict[str, int]:
    """{"tp", "pp", "dp"} the checkpoint was saved at ({} for checkpoints from before it was recorded)."""
    return dict((read_json(ckpt_dir / MANIFEST_NAME) or {}).get("layout") or {})


def choose_resume_checkpoint(paths: RunPaths, layout: dict[str, int], job_id: str = "") -> tuple[Path | None, bool]:
    """(checkpoint, is_universal) to resume this layout from (collective).

    The newest verified checkpoint, as saved when its layout is this job's; at another layout its
    universal conversion `step_N_universal` (made by `python -m trainer.universal RUN_DIR --step N`),
    which must verify too. No conversion yet: a LayoutError that says which command makes it."""
    from trainer.parallel.groups import LayoutError

    found = find_resume_checkpoint(paths, job_id)
    if found is None:
        return None, False
    saved = saved_layout(found)
    if not saved or saved == layout:
        return found, False
    universal = found.with_name(found.name + UNIVERSAL_SUFFIX)
    problems = verify_shared(universal) if universal.is_dir() else ["not converted yet"]
    if problems:
        describe = " ".join(f"{k}={v}" for k, v in sorted(saved.items()))
        now = " ".join(f"{k}={v}" for k, v in sorted(layout.items()))
        raise LayoutError(
            f"{found.name} was saved at {describe} but this job runs {now}; {universal.name}: "
            f"{'; '.join(problems[:3])}. Convert it once with `python -m trainer.universal {paths.root} "
            f"--step {step_of(found.name)}`, then resubmit"
        )
    return universal, True


# -- RNG ---------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- save / load ------------------------------------------------------------------------------
def save_checkpoint(engine, paths: RunPaths, step: int, client_state: dict[str, Any], keep_last: int,
                    job_id: str = "", extra_client_state: dict[str, Any] | None = None,
                    layout: dict[str, int] | None = None, seal: bool = True) -> Path:
    """Collective. Returns the checkpoint directory once MANIFEST and `latest` are written.
    seal=False: trainer.async_checkpoint's snapshot, which seals after its background write.
    `extra_client_state` goes to DeepSpeed's client state at the top level (e.g. the universal
    checkpoint info that ds_to_universal reads)."""
    rank, world = dist_world()
    tag = CHECKPOINT_NAME_FORMAT.format(step=step)
    ckpt_dir = paths.checkpoint(step)
    if rank == 0 and ckpt_dir.exists():
        # A leftover of a save that died (no manifest), or a re-save of the same step after a
        # resume: moved aside, not deleted (it may be what someone is debugging).
        aside = ckpt_dir.with_name(f".replaced-{tag}-{int(time.time())}")
        ckpt_dir.rename(aside)
        print(f"[checkpoint] {tag} existed; moved to {aside.name}", file=sys.stderr, flush=True)
    dist_barrier()
    engine.save_checkpoint(str(paths.checkpoints), tag=tag, client_state={**(extra_client_state or {}), CLIENT_STATE_KEY: client_state},
                           save_latest=False)
    rng_dir = ckpt_dir / "rng"
    rng_dir.mkdir(parents=True, exist_ok=True)
    # Through the engine's checkpoint engine, as every DeepSpeed file: an async save captures it.
    engine.checkpoint_engine.save(rng_state(), str(rng_dir / f"rank-{rank:05d}.pt"))
    if not seal:
        return ckpt_dir
    dist_barrier()  # every rank's files are on disk
    files = list_files(ckpt_dir)
    files = gather_to_all(files)[0]  # rank 0's listing is the one every rank hashes a share of
    entries = hash_files_shared(ckpt_dir, files)
    if rank == 0:
        write_manifest(ckpt_dir, entries, {"step": step, "world_size": world, "job_id": job_id,
                                           "layout": layout or {}})
        write_latest(paths, tag)
        cleanup_old_checkpoints(paths, keep_last)
    dist_barrier()
    return ckpt_dir


def load_checkpoint(engine, paths: RunPaths, ckpt_dir: Path) -> dict[str, Any]:
    """Collective. Restores weights, fp32 master, Adam, engine counters and this rank's RNG;
    returns our client state."""
    rank, _ = dist_world()
    load_path, client = engine.load_checkpoint(
        str(ckpt_dir.parent), tag=ckpt_dir.name, load_optimizer_states=True, load_lr_scheduler_states=False
    )
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load {ckpt_dir}, although its manifest verified")
    rng_file = ckpt_dir / "rng" / f"rank-{rank:05d}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        print(f"[checkpoint] no RNG state for rank {rank} in {ckpt_dir.name} (different world size?): "
              "RNG streams restart from the seed", file=sys.stderr, flush=True)
    return dict(client[CLIENT_STATE_KEY])


def cleanup_old_checkpoints(paths: RunPaths, keep_last: int) -> list[str]:
    """Delete complete, non-damaged checkpoints older than the newest `keep_last` complete ones;
    never the one `latest` names. Rank 0 only. Returns the names deleted."""
    complete = complete_checkpoints(paths)
    keep = {d.name for _, d in complete[-max(1, keep_last):]}
    protected = keep | damaged_names(paths)
    latest = read_latest(paths)
    if latest:
        protected.add(latest)
    deleted = []
    for _, ckpt_dir in complete:
        if ckpt_dir.name in protected:
            continue
        # Rename first so that a half-deleted directory never looks like a checkpoint.
        doomed = ckpt_dir.with_name(f".deleting-{ckpt_dir.name}")
        os.replace(ckpt_dir, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(ckpt_dir.name)
    return deleted
