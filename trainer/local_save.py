"""What an async save does for the node-local copies (`checkpoint.local_dir`, trainer/local_copies.py).

In each rank's background writer (trainer/async_checkpoint.py), after the shared files:
1. every file this rank wrote is written again from the same host snapshot into its node's
   `own/` folder (the same torch.save call, so the same bytes: checked against the sha256 the
   shared file got; a copy that differs is not kept);
2. once rank 0 sealed the shared checkpoint, it sends every rank the MANIFEST text and the files
   only it wrote (the JSON files: small) are copied into its own folder;
3. every rank sends its own files to its buddy rank (trainer/local_copies.buddy_ranks) over the
   writers' gloo group (trainer/peer_replica.py), which keeps them in its node's `peer/` folder;
4. every node writes owners.json and MANIFEST.json into its copy (last: the copy now exists) and
   drops older copies.
A save that was not sealed leaves the local copies without a MANIFEST: not a copy, as on the shared
filesystem. A failure here never fails the save: the shared copy is the source of truth.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as tdist

from orchestrator.contract import MANIFEST_NAME, Mark, sha256_file
from orchestrator.contract.client.progress import sha256_counted
from trainer.local_copies import OWN, PEER, IncomingFile, LocalCopyError, LocalStore, buddy_ranks, node_name
from trainer.peer_replica import Transfer, run_transfers
from trainer.progress_io import save_counted


@dataclass
class LocalCopies:
    """One per rank, made where the AsyncCheckpointer is (every rank, the same point)."""

    store: LocalStore
    rank: int
    world: int
    rank_nodes: list[str]  # node of each rank of this launch
    buddies: dict[int, int]  # rank -> the rank that keeps its replica
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)  # this save: rel -> entry, own copies
    seconds: float = 0.0

    @classmethod
    def start(cls, cfg, run_dir: Path, job_id: str, group) -> LocalCopies | None:
        """Collective over `group` (None: one rank). None when checkpoint.local_dir is not set."""
        if cfg.checkpoint.local_dir is None:
            return None
        rank = tdist.get_rank() if tdist.is_initialized() else 0
        world = tdist.get_world_size() if tdist.is_initialized() else 1
        node = node_name()
        rank_nodes = [node]
        if group is not None:
            rank_nodes = [None] * world
            tdist.all_gather_object(rank_nodes, node, group=group)
        store = LocalStore.of(cfg.checkpoint.local_dir, run_dir, job_id, node)
        domains = [list(g) for g in cfg.checkpoint.failure_domains]
        buddies = buddy_ranks(rank_nodes, cfg.checkpoint.peer_offset, domains)
        if rank == 0:
            pairs = sorted({(rank_nodes[r], rank_nodes[b]) for r, b in buddies.items()})
            print(f"[trainer] local copies in {cfg.checkpoint.local_dir}; buddy replicas: "
                  f"{', '.join(f'{a}->{b}' for a, b in pairs) or 'none (one node)'}", flush=True)
        return cls(store, rank, world, rank_nodes, buddies)

    # -- 1. in the writer, file by file ----------------------------------------------------------
    def keep_own(self, step: int, rel: str, state: Any, serialization: bool, entry: dict[str, Any]) -> None:
        started = time.time()
        try:
            self.store.create()
            path = self.store.path(step, OWN, rel)
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            save_counted(state, path, serialization)  # as the shared file was written: the same bytes
            if sha256_counted(path, Mark.SAVE_BYTES) != entry["sha256"]:
                self.store.drop(step, OWN, rel)
                raise LocalCopyError(f"the local copy of {rel} differs from the shared file")
            self.kept[rel] = dict(entry)
        except (OSError, LocalCopyError) as exc:
            print(f"[checkpoint] rank {self.rank}: no local copy of {rel}: {exc}", file=sys.stderr, flush=True)
        self.seconds += time.time() - started

    # -- 2-4. after the seal, collective over the writers' group -----------------------------------
    def after_seal(self, group, ckpt_dir: Path, step: int, reports: list[tuple[Any, dict]],
                   sealed: bool, keep: int) -> None:
        started = time.time()
        manifest_text = None
        if self.rank == 0 and sealed:
            manifest_text = (ckpt_dir / MANIFEST_NAME).read_text()
        shared = [manifest_text]
        if group is not None:
            tdist.broadcast_object_list(shared, src=0, group=group)
        manifest_text = shared[0]
        if manifest_text is None:
            self.kept = {}
            return
        import json

        entries = json.loads(manifest_text)["files"]
        owners = {rel: r for r, (_, mine) in enumerate(reports) for rel in mine}
        for rel in entries:
            owners.setdefault(rel, 0)  # written by rank 0 directly (the JSON files)
        if self.rank == 0:
            for rel, owner in owners.items():
                if owner == 0 and rel not in self.kept:
                    self._copy_in(step, rel, ckpt_dir / rel, entries[rel])
        transfers = self._replica_transfers(owners, entries, group)
        if group is not None and transfers:
            run_transfers(transfers, group, lambda t: self.store.open_held(step, OWN, t.rel),
                          lambda t: self._replica_sink(step, t.rel))
        if group is not None:
            tdist.barrier(group=group)  # every replica of this node is in place before it is sealed
        try:
            self.store.create().seal(step, manifest_text, owners)
            self.store.prune(keep)
        except (OSError, LocalCopyError) as exc:
            print(f"[checkpoint] rank {self.rank}: local copy of step {step} not sealed: {exc}",
                  file=sys.stderr, flush=True)
        self.kept = {}
        self.seconds += time.time() - started
        if self.rank == 0:
            print(f"[trainer] local copies of {ckpt_dir.name}: own + buddy replicas kept in {self.seconds:.2f}s "
                  f"(rank 0)", flush=True)
        self.seconds = 0.0

    def _copy_in(self, step: int, rel: str, source: Path, entry: dict[str, Any]) -> None:
        try:
            self.store.create()
            copy = self.store.copy_in(step, OWN, rel, source)
            if sha256_file(copy) == entry["sha256"]:
                self.kept[rel] = entry
            else:
                self.store.drop(step, OWN, rel)
        except (OSError, LocalCopyError) as exc:
            print(f"[checkpoint] no local copy of {rel}: {exc}", file=sys.stderr, flush=True)

    def _replica_transfers(self, owners: dict[str, int], entries: dict[str, Any], group) -> list[Transfer]:
        """Every rank's kept files to its buddy; the same list on every rank (who kept what is
        gathered: a file a rank failed to keep is not sent)."""
        kept_by_rank = [sorted(self.kept)]
        if group is not None:
            kept_by_rank = [None] * self.world
            tdist.all_gather_object(kept_by_rank, sorted(self.kept), group=group)
        transfers = []
        for rank, rels in enumerate(kept_by_rank):
            buddy = self.buddies.get(rank)
            if buddy is None:
                continue
            transfers += [Transfer(rank, buddy, rel, int(entries[rel]["size"])) for rel in rels
                          if rel in entries and owners.get(rel) == rank]
        return transfers

    def _replica_sink(self, step: int, rel: str) -> IncomingFile | None:
        try:
            return self.store.create().incoming(step, PEER, rel)
        except (OSError, LocalCopyError) as exc:
            print(f"[checkpoint] rank {self.rank}: no buddy replica of {rel}: {exc}", file=sys.stderr, flush=True)
            return None
