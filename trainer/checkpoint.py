"""Checkpoints under `checkpoints/step_NNNNNNN/`: DeepSpeed's files, ours, a MANIFEST, `latest`.

`checkpoints/` is the config's `checkpoint.dir` (relative to the run directory, or absolute, e.g. a
scratch filesystem): `RunPaths.of(run_dir, cfg.checkpoint.dir).checkpoints`, the one rule the
controller and the dashboard use too. The manifest helpers are trainer.checkpoint_format's.

Save (every rank calls it; collective):
0. rank 0 writes our JSON files: `trainer_state.json` (the counters and the rollback bookkeeping,
   orchestrator.contract.directive.CheckpointState, readable without torch) and `probe.json`
   (what the model being saved computes on the probe batch, trainer/probe.py).
1. `engine.save_checkpoint(checkpoints/, tag=step_N, client_state=...)`: DeepSpeed's model and
   optimizer files (bf16 weights, fp32 master partitions, Adam moments) plus our client state
   (step, consumed samples, LR samples, rampup batch, schedule parameters).
2. `rng/rank-NNNNN.pt` per rank: python/numpy/torch RNG states (differ per rank: dropout).
3. barrier; the file list is hashed in parallel (file i by rank i % world), gathered on rank 0,
   which writes MANIFEST.json (every file, size, sha256) LAST, atomically, then points `latest`
   at the new checkpoint (atomic rename), then applies keep-last-N.

A checkpoint without a MANIFEST is not a checkpoint (a save that died half way). Resume takes the
newest `step_*` not newer than `latest` whose manifest verifies; a damaged one is skipped, reported
on stderr and in `checkpoints/damaged.jsonl`, and never deleted. A checkpoint whose probe failed
after its load (trainer/probe.py) verifies by hash, so its report carries the sha256 of its
MANIFEST, and a checkpoint with that exact manifest is skipped without being loaded again (a later
save of the same step has another manifest). Cleanup deletes only complete,
non-damaged checkpoints older than the newest `keep_last` complete ones, never the one `latest`
names, so it can never delete the only good checkpoint.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.contract import (  # noqa: F401 - verify_manifest: used via this module
    CHECKPOINT_NAME_FORMAT,
    DAMAGED_LOG_NAME,
    MANIFEST_NAME,
    RunPaths,
    atomic_write_text,
    prune_checkpoints,
    read_manifest,
    resume_candidates,
    sha256_file,
    step_of,
    verify_manifest,
    write_latest,
)
from orchestrator.contract.client.checkpoints import list_files, seal_checkpoint, write_manifest  # noqa: F401
from orchestrator.contract.manifest import DamageReport, read_damage_reports, report_damage
from trainer.checkpoint_format import (  # noqa: F401 - re-exported: the manifest helpers
    UNIVERSAL_SUFFIX,
    dist_barrier,
    dist_world,
    gather_to_all,
    hash_files_shared,
    verify_shared,
)

CLIENT_STATE_KEY = "trainer"


# -- damage reports ------------------------------------------------------------------------
def report_damaged(paths: RunPaths, ckpt_dir: Path, problems: list[str], job_id: str,
                   manifest_sha256: str | None = None) -> None:
    print(f"[checkpoint] SKIPPING damaged checkpoint {ckpt_dir.name}: {'; '.join(problems[:5])}", file=sys.stderr,
          flush=True)
    report_damage(
        paths.checkpoints,
        DamageReport(ckpt_dir.name, problems[:20], job_id, time.time(), manifest_sha256=manifest_sha256),
    )


def manifest_digest(ckpt_dir: Path) -> str | None:
    """sha256 of a checkpoint's MANIFEST.json: the identity of this save of this step."""
    try:
        return sha256_file(Path(ckpt_dir) / MANIFEST_NAME)
    except OSError:
        return None


def verified_checkpoints(paths: RunPaths, job_id: str = "") -> Iterator[Path]:
    """Complete checkpoints not newer than `latest` whose manifest verifies, newest first
    (collective: every rank iterates the same list, from rank 0's view of the filesystem). The
    candidates and their order are the contract's (orchestrator.contract.resume_candidates), which
    the controller uses to predict the same choice; hash failures are reported as they are met, and
    a checkpoint whose probe failed before (same manifest) is skipped without a word."""
    rank, _ = dist_world()
    # Rank 0's view for everyone: a lagging shared filesystem must not make ranks diverge.
    candidates, probe_failed = gather_to_all((
        [str(d) for d in resume_candidates(paths.checkpoints)],
        {r.manifest_sha256 for r in read_damage_reports(paths.checkpoints) if r.manifest_sha256},
    ))[0]
    for ckpt_name in candidates:
        ckpt_dir = Path(ckpt_name)
        if gather_to_all(manifest_digest(ckpt_dir))[0] in probe_failed:
            continue
        problems = verify_shared(ckpt_dir)
        if not problems:
            yield ckpt_dir
        elif rank == 0:
            report_damaged(paths, ckpt_dir, problems, job_id)


def find_resume_checkpoint(paths: RunPaths, job_id: str = "") -> Path | None:
    """The newest of `verified_checkpoints` (collective)."""
    return next(verified_checkpoints(paths, job_id), None)


def saved_layout(ckpt_dir: Path) -> dict[str, int]:
    """{"tp", "pp", "dp"} the checkpoint was saved at ({} for checkpoints from before it was recorded)."""
    manifest = read_manifest(ckpt_dir)
    return dict(manifest.layout) if manifest is not None else {}


def choose_resume_checkpoint(paths: RunPaths, layout: dict[str, int], job_id: str = "") -> tuple[Path | None, bool]:
    """(checkpoint, is_universal) to resume this layout from (collective): `loadable_form` of the
    newest verified checkpoint."""
    found = find_resume_checkpoint(paths, job_id)
    return (None, False) if found is None else loadable_form(paths, found, layout)


def loadable_form(paths: RunPaths, found: Path, layout: dict[str, int]) -> tuple[Path, bool]:
    """(checkpoint, is_universal) that loads `found` at this layout (collective): `found` itself
    when its layout is this job's; at another layout its universal conversion `step_N_universal`
    (made by `python -m trainer.universal RUN_DIR --step N`), which must verify too. No conversion
    yet: a LayoutError that says which command makes it."""
    from trainer.parallel.groups import LayoutError

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


# What an RNG file holds besides tensors and plain values: numpy's MT19937 state, an ndarray of
# uint32. torch.load(weights_only=True) accepts these and nothing else (no code runs on load).
RNG_SAFE_GLOBALS = [np.empty(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_rng_state(path: Path) -> dict[str, Any]:
    with torch.serialization.safe_globals(RNG_SAFE_GLOBALS):
        return torch.load(path, weights_only=True)


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# -- save / load ------------------------------------------------------------------------------
def save_checkpoint(engine, paths: RunPaths, step: int, client_state: dict[str, Any], keep_last: int,
                    job_id: str = "", extra_client_state: dict[str, Any] | None = None,
                    layout: dict[str, int] | None = None, seal: bool = True,
                    json_files: dict[str, Any] | None = None, before_write: Callable[[], None] | None = None) -> Path:
    """Collective. Returns the checkpoint directory once MANIFEST and `latest` are written.
    seal=False: trainer.async_checkpoint's snapshot, which seals after its background write.
    `extra_client_state` goes to DeepSpeed's client state at the top level (e.g. the universal
    checkpoint info that ds_to_universal reads). `json_files` {name: data}: written by rank 0 into
    the checkpoint (covered by the manifest). `before_write`: called on every rank right before
    DeepSpeed writes (a TEST-ONLY fault hook, trainer.faults)."""
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
    if rank == 0 and json_files:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        for name, data in json_files.items():
            atomic_write_text(ckpt_dir / name, json.dumps(data, indent=1, sort_keys=True) + "\n")
    if before_write is not None:
        before_write()
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
        seal_checkpoint(paths.checkpoints, ckpt_dir, entries,
                        {"step": step, "world_size": world, "job_id": job_id, "layout": layout or {}}, keep_last)
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
        set_rng_state(load_rng_state(rng_file))
    else:
        print(f"[checkpoint] no RNG state for rank {rank} in {ckpt_dir.name} (different world size?): "
              "RNG streams restart from the seed", file=sys.stderr, flush=True)
    return dict(client[CLIENT_STATE_KEY])


