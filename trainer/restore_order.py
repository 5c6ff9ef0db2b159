"""Restore from the nearest good copy: a relaunch inside the allocation loads each file from this
node's local copy, else from a peer that holds it, else from the shared checkpoint.

Collective helpers of trainer/loop.py's build(), used only when `checkpoint.local_dir` is set, no
rollback directive or replay pins the choice, and a node of this job holds a sealed local copy
(trainer/local_copies.py; a job-level restart, on new nodes or not, has none: it reads the shared
copy as always).

1. `newest_local_step` (before the engine exists): the newest step some node holds, whose
   manifest (the same on every node that holds it) was saved at this layout, if it is the one
   `checkpoints/latest` names. Nothing of the shared checkpoint is read but that name.
2. `prepare` (once the engine exists: DeepSpeed's own naming says which files each rank reads):
   every rank lists the files its load reads (`files_read_by`); for each file, in this order:
   its node's copy (own files first, then a buddy replica), then each other node that holds it
   (fetched over the job's network, trainer/peer_replica.py), then the shared checkpoint. Every
   copy is checked against the manifest's sha256 before it is used; a copy that fails is deleted,
   reported (`dropped`, one line naming the node and the path) and the next copy in order is tried.
3. Each rank loads from its own folder `restore-rank-NNNNN/step_N` of hard links to the checked
   copies (the shared file's path, as a symlink, for a file no copy had); the probe then checks
   what the restored model computes (trainer/resume.py). A probe that fails drops the local
   restore as a whole, and the shared checkpoint is loaded as before.
`RestoreLog` records every file the restore reads, where from and its bytes: the evidence that a
restore read nothing from the shared filesystem.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import torch.distributed as tdist

from orchestrator.contract import (
    CHECKPOINT_NAME_FORMAT,
    CHECKPOINT_STATE_NAME,
    MANIFEST_NAME,
    PROBE_NAME,
    read_latest,
    sha256_file,
)
from trainer.checkpoint_format import dist_world, gather_to_all
from trainer.local_copies import (
    FETCHED,
    OWN,
    RESTORE_PREFIX,
    IncomingFile,
    LocalCopyError,
    LocalStore,
    node_name,
)
from trainer.peer_replica import Transfer, run_transfers

LOCAL, FROM_PEER, SHARED = "local", "peer", "shared"  # where a file read at the restore came from
MAX_ATTEMPTS = 4  # rounds of "next copy" (local, then peers, then shared): a few nodes hold a file


@dataclass
class RestoreLog:
    """Every file this rank's restore reads: (rel, source, bytes, path)."""

    reads: list[tuple[str, str, int, str]] = field(default_factory=list)

    def add(self, rel: str, source: str, size: int, path: str) -> None:
        self.reads.append((rel, source, size, path))

    def bytes_by_source(self) -> dict[str, int]:
        out = {LOCAL: 0, FROM_PEER: 0, SHARED: 0}
        for _, source, size, _ in self.reads:
            out[source] += size
        return out


@dataclass
class LocalRestore:
    step: int
    folder: Path  # this rank's restore-rank-NNNNN/step_N: what DeepSpeed loads
    store_base: Path  # this node's copies
    log: RestoreLog
    dropped: list[str]  # every rank's copies that failed their check (the same list on every rank)
    bytes: dict[str, int]  # every rank's reads by source (the same on every rank)
    seconds: dict[str, float]


def _store(cfg, run_dir: Path, job_id: str) -> LocalStore | None:
    try:
        store = LocalStore.of(cfg.checkpoint.local_dir, run_dir, job_id)
    except LocalCopyError:
        return None
    return store if store.usable() else None


def newest_local_step(cfg, run_dir: Path, job_id: str, layout: dict[str, int], checkpoints: Path) -> int | None:
    """Collective. The step to restore from local copies, or None (restore from the shared copy).
    It must be the one `checkpoints/latest` names (a name, read by rank 0: no checkpoint bytes):
    a process that died between sealing the shared checkpoint and its local copy leaves the local
    copies a step behind, and the shared one is then the newer."""
    rank, _ = dist_world()
    latest = gather_to_all(read_latest(checkpoints) if rank == 0 else None)[0]
    store = _store(cfg, run_dir, job_id)
    mine = None
    if store is not None:
        for step in reversed(store.sealed_steps()):
            try:
                manifest = json.loads(store.manifest_text(step))
            except (OSError, ValueError):
                continue
            mine = (step, sha256_text(store.manifest_text(step)), manifest.get("layout") or {})
            break
    held = [m for m in gather_to_all(mine) if m is not None]
    if not held:
        return None
    step = max(m[0] for m in held)
    at_step = {(m[1], json.dumps(m[2], sort_keys=True)) for m in held if m[0] == step}
    if len(at_step) != 1:
        return None  # two saves of one step differ between nodes: only the shared copy is sure
    layout_saved = next(iter(at_step))[1]
    if latest != CHECKPOINT_NAME_FORMAT.format(step=step) or json.loads(layout_saved) != layout:
        return None
    return step


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def files_read_by(engine, rank: int, tag: str) -> list[str]:
    """The checkpoint files (relative) this rank's load reads, from DeepSpeed's own naming: its
    model-states file, its ZeRO partition, its pipeline stage's layer files at its TP rank, its
    RNG file; rank 0 also our JSON files."""
    files = [os.path.relpath(engine._get_ckpt_name("", tag), tag)]
    try:
        files.append(os.path.relpath(engine._get_zero_ckpt_name("", tag), tag))
    except AttributeError:
        pass  # no ZeRO optimizer: no partition file
    module = engine.module
    for index, layer in enumerate(getattr(module, "forward_funcs", [])):
        if hasattr(layer, "load_state_dict"):
            files.append(module.ckpt_layer_path("", index))
    files.append(f"rng/rank-{rank:05d}.pt")
    if rank == 0:
        files += [CHECKPOINT_STATE_NAME, PROBE_NAME]
    return sorted(set(files))


def prepare(cfg, run_dir: Path, shared_dir: Path, job_id: str, engine, step: int, group) -> LocalRestore | None:
    """Collective. Fetches and checks the copies of `step`; None when this node's store cannot be
    used (the restore then reads the shared copy)."""
    started = time.time()
    rank, world = dist_world()
    store = _store(cfg, run_dir, job_id)
    tag = CHECKPOINT_NAME_FORMAT.format(step=step)
    usable = gather_to_all(store is not None and (store.step_dir(step) / MANIFEST_NAME).is_file())
    if not any(usable):
        return None
    manifest_text = None
    if store is not None and usable[rank]:
        manifest_text = store.manifest_text(step)
    texts = [t for t in gather_to_all(manifest_text) if t is not None]
    manifest_text = texts[0]
    entries = json.loads(manifest_text)["files"]
    needs = [rel for rel in files_read_by(engine, rank, tag) if rel in entries]
    # DeepSpeed opens the first file of a list (a layer's files of every TP rank, every
    # model-parallel rank's model states) to check the list (SDLoaderBase.check_ckpt_list) before
    # it reads its own.
    for rel in list(needs):
        family = rel.split("-", 1)[0] + "-" if rel.startswith("layer_") else \
            "mp_rank_" if rel.startswith("mp_rank_") and rel.endswith("_model_states.pt") else None
        if family is not None:
            needs.append(sorted(name for name in entries if name.startswith(family)
                                and name.endswith("model_states.pt"))[0])
    needs = sorted(set(needs))
    if store is None:
        store = LocalStore.of(cfg.checkpoint.local_dir, run_dir, job_id)
    store.create()
    tried: dict[str, set[str]] = {rel: set() for rel in needs}
    resolved: dict[str, tuple[Path, str]] = {}
    dropped: list[str] = []
    node = node_name()
    fetched_bytes = 0
    for _ in range(MAX_ATTEMPTS):
        # this rank's pending files, and what this node holds now
        pending = sorted(rel for rel in needs if rel not in resolved and rel not in _shared_only(tried, rel))
        everyone = gather_to_all((node, pending, {rel: sorted(t) for rel, t in tried.items() if t},
                                  store.holdings(step)))
        if not any(p for _, p, _, _ in everyone):
            break
        # 1. this node's copy, checked
        held = store.holdings(step)
        for rel in pending:
            if node not in tried[rel] and rel in held:
                _check(store, step, held[rel], rel, entries[rel], node, tried, resolved, dropped)
        # 2. a fetch from the next node that holds it (the same plan on every rank)
        transfers = _plan_fetches(everyone, entries)
        if transfers:
            fetched_bytes += run_transfers(transfers, group, lambda t: _open_held(store, step, t.rel),
                                           lambda t: _fetched_sink(store, step, t.rel))
            tdist.barrier(group=group)
            for t in transfers:
                if t.dst == rank:
                    source_node = everyone[t.src][0]
                    tried[t.rel].add(node)  # this node's own copy, if any, is behind us
                    if store.path(step, FETCHED, t.rel).is_file():
                        _check(store, step, FETCHED, t.rel, entries[t.rel], source_node, tried, resolved, dropped)
                    else:
                        tried[t.rel].add(source_node)
                        dropped.append(f"{source_node}: {t.rel}: could not be sent")
        else:
            for rel in pending:  # nothing left to fetch: the shared copy
                tried[rel].add("*")
    folder, log = _link_restore_folder(store, step, rank, entries, manifest_text, resolved, shared_dir, needs)
    all_dropped = sorted({d for part in gather_to_all(dropped) for d in part})
    return LocalRestore(step, folder, store.base, log, all_dropped, total_bytes(log),
                        {"copies_checked_and_fetched": round(time.time() - started, 3)})


def _shared_only(tried: dict[str, set[str]], rel: str) -> set[str]:
    return {rel} if "*" in tried[rel] else set()


def _check(store: LocalStore, step: int, kind: str, rel: str, entry: dict, holder: str,
           tried: dict[str, set[str]], resolved: dict[str, tuple[Path, str]], dropped: list[str]) -> None:
    """A copy is used only when its sha256 is the manifest's; else it is deleted and reported."""
    path = store.path(step, kind, rel)
    tried[rel].add(holder)
    try:
        ok = path.stat().st_size == int(entry["size"]) and sha256_file(path) == entry["sha256"]
    except OSError:
        ok = False
    if ok:
        resolved[rel] = (path, LOCAL if kind == OWN else FROM_PEER)
        return
    if kind == FETCHED:  # named by where it came from: that node's copy is the bad one
        copy = f"{holder}'s copy of {rel} (fetched by {store.node})"
    else:
        copy = f"{store.node}'s {'own copy' if kind == OWN else 'buddy replica'} {path}"
    dropped.append(f"{copy}: sha256 differs from the manifest; dropped, the next copy is used")
    store.drop(step, kind, rel)


def _plan_fetches(everyone: list, entries: dict) -> list[Transfer]:
    """For each rank's pending file its node does not hold (or held and failed): the next node,
    not yet tried, that holds it (own copies before replicas), the rank there of the same position."""
    ranks_of: dict[str, list[int]] = {}
    for rank, (node, _, _, _) in enumerate(everyone):
        ranks_of.setdefault(node, []).append(rank)
    transfers = []
    for rank, (node, pending, tried, held) in enumerate(everyone):
        for rel in pending:
            done = set(tried.get(rel, []))
            if node not in done and rel in held:
                continue  # checked locally this round
            holders = sorted(((h[3][rel] != OWN, other) for other, h in _by_node(everyone).items()
                              if other != node and other not in done and rel in h[3]))
            if not holders:
                continue
            source = holders[0][1]
            peers = ranks_of[source]
            transfers.append(Transfer(peers[ranks_of[node].index(rank) % len(peers)], rank, rel,
                                      int(entries[rel]["size"])))
    return transfers


def _by_node(everyone: list) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    for item in everyone:
        out.setdefault(item[0], item)
    return out


def _open_held(store: LocalStore, step: int, rel: str) -> BinaryIO | None:
    kind = store.holdings(step).get(rel)
    return None if kind is None else store.open_held(step, kind, rel)


def _fetched_sink(store: LocalStore, step: int, rel: str) -> IncomingFile | None:
    try:
        return store.incoming(step, FETCHED, rel)
    except OSError as exc:  # not kept: the file is not resolved and the next copy in order is used
        print(f"[restore] cannot keep {rel} fetched from a peer: {exc}", file=sys.stderr, flush=True)
        return None


def _link_restore_folder(store: LocalStore, step: int, rank: int, entries: dict, manifest_text: str,
                         resolved: dict[str, tuple[Path, str]], shared_dir: Path,
                         needs: list[str]) -> tuple[Path, RestoreLog]:
    """restore-rank-NNNNN/step_N: hard links to the checked copies (copies of the JSON records,
    which their reader wants plain: one link, no symlink), the shared path for everything else (a layer file of another TP rank that
    DeepSpeed's glob must see but does not read; a file no copy had)."""
    root = store.base / f"{RESTORE_PREFIX}{rank:05d}"
    shutil.rmtree(root, ignore_errors=True)
    folder = root / CHECKPOINT_NAME_FORMAT.format(step=step)
    folder.mkdir(parents=True, mode=0o700)
    (folder / MANIFEST_NAME).write_text(manifest_text)
    log = RestoreLog()
    for rel in entries:
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if rel in resolved:
            path, source = resolved[rel]
            if rel.endswith(".json"):
                shutil.copyfile(path, target)  # a record must be a file of its own (one link)
            else:
                os.link(path, target)
        else:
            path, source = shared_dir / rel, SHARED
            target.symlink_to(path)
        if rel in needs:
            log.add(rel, source, int(entries[rel]["size"]), str(path))
    return folder, log


class WatchReads:
    """While the local restore loads: every file DeepSpeed reads that is not one of this node's
    copies is logged as read from the shared checkpoint (a file the plan did not foresee)."""

    def __init__(self, engine, restore: LocalRestore, store_base: Path) -> None:
        self.engine, self.restore, self.base = engine, restore, str(store_base.resolve())
        self.planned = {str(Path(path).resolve()) for _, _, _, path in restore.log.reads}

    def __enter__(self) -> WatchReads:
        checkpoint_engine = self.engine.checkpoint_engine
        self.original = checkpoint_engine.load

        def load(path, map_location=None):
            real = str(Path(path).resolve())
            if not real.startswith(self.base + os.sep) and real not in self.planned:
                size = os.path.getsize(real) if os.path.exists(real) else 0
                self.restore.log.add(os.path.relpath(path, self.restore.folder), SHARED, size, f"{real} (unplanned)")
            return self.original(path, map_location=map_location)

        checkpoint_engine.load = load
        return self

    def __exit__(self, *exc) -> None:
        self.engine.checkpoint_engine.load = self.original


def total_bytes(log: RestoreLog) -> dict[str, int]:
    """Collective: every rank's reads by source."""
    totals = {LOCAL: 0, FROM_PEER: 0, SHARED: 0}
    for part in gather_to_all(log.bytes_by_source()):
        for key, value in part.items():
            totals[key] += value
    return totals
