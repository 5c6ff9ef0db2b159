"""Asynchronous checkpoints (`checkpoint.async_save: true`): training stalls for a host copy of the
state, not for the write.

At the save point every rank runs the ordinary save (trainer.checkpoint.save_checkpoint, unsealed)
with DeepSpeed's checkpoint engine replaced by `HostSnapshotEngine`: each `save(state_dict, path)`
DeepSpeed (and our RNG file) makes becomes a host copy of that state dict, nothing is written. On a
GPU the copies are non-blocking into pinned memory with one synchronize at the end; on CPU a clone.
Then training goes on, and a background thread of each rank persists its snapshot with the very
`torch.save` call DeepSpeed's TorchCheckpointEngine makes (so `engine.load_checkpoint` reads it
unchanged), fsyncs each file and the directories, and hashes what it wrote.

Sealing, as for a sync save: the writers meet in one `all_gather_object` on a gloo process group of
their own (created once at start by every rank: a background thread must never enter a collective
of the training group, whose order it would break). Only when every rank reports its files written
does rank 0 write MANIFEST.json (last, atomically) and then `latest`. So a failure or a kill during
the snapshot or the write leaves a `step_N` without MANIFEST, which is not a checkpoint, and
`latest` on the previous one. A new save waits for the previous write; the loop waits for an
in-flight write before exiting (kill switch, time budget, finished).
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from orchestrator.contract import Mark, RunPaths, fsync_dir
from orchestrator.contract.client.checkpoints import list_files, seal_checkpoint
from orchestrator.contract.client.progress import sha256_counted, waiting
from trainer import checkpoint as ckpt
from trainer.checkpoint_format import dist_world
from trainer.progress_io import save_counted


# -- the snapshot ------------------------------------------------------------------------------
class HostSnapshot:
    """Host copies of tensors (like DeepSpeed's clone_tensors_for_torch_save, onto the host): from
    a GPU non-blocking copies into pinned memory, complete after `synchronize()` (one for the whole
    snapshot, not one per tensor).

    The host buffers of the previous snapshot are reused when the tensors come in the same order
    with the same shapes (every save after the first): allocating, page-faulting or pinning
    gigabytes at each save would be most of the stall. Only reused once that snapshot is written."""

    def __init__(self, reuse: list[torch.Tensor] | None = None) -> None:
        self.from_gpu = False
        self.bytes = 0
        self.buffers: list[torch.Tensor] = []  # every host tensor of this snapshot, in capture order
        self.reuse = reuse or []

    def copy(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            tensor = obj.detach()
            self.bytes += tensor.numel() * tensor.element_size()
            on_gpu = tensor.device.type != "cpu"
            self.from_gpu |= on_gpu
            index = len(self.buffers)
            host = self.reuse[index] if index < len(self.reuse) else None
            if host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=on_gpu)
            host.copy_(tensor, non_blocking=on_gpu)
            self.buffers.append(host)
            return host
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps OrderedDict & co: the file holds the same types
            for key, value in obj.items():
                out[key] = self.copy(value)
            return out
        if isinstance(obj, list):
            return [self.copy(v) for v in obj]
        if isinstance(obj, tuple):
            values = [self.copy(v) for v in obj]
            return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
        return obj  # ints, strings, numpy RNG arrays (already fresh copies), DeepSpeed's config

    def synchronize(self) -> None:
        if self.from_gpu:
            torch.cuda.synchronize()


class HostSnapshotEngine(CheckpointEngine):
    """Stands in for engine.checkpoint_engine during save_checkpoint: records (path, host copy)
    for every file instead of writing it. DeepSpeed's directory creation still happens (cheap)."""

    def __init__(self, serialization: bool, on_save=None, reuse: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.name = "HostSnapshotEngine"
        self.serialization = serialization
        self.snapshot = HostSnapshot(reuse)
        self.files: list[tuple[str, Any]] = []
        self.on_save = on_save

    def create(self, info) -> None:
        pass

    def save(self, state_dict, path: str) -> None:
        if self.on_save is not None:
            self.on_save()
        self.files.append((str(path), self.snapshot.copy(state_dict)))

    def load(self, path: str, map_location=None):
        raise RuntimeError("HostSnapshotEngine only saves; it is in place during save_checkpoint only")

    def commit(self, info) -> bool:
        return True

    def preserves_storage_sharing(self) -> bool:
        return False  # we copy every tensor ourselves: DeepSpeed need not clone first


# -- the writer --------------------------------------------------------------------------------
def persist(path: Path, state: Any, serialization: bool, after_chunk=None) -> dict[str, Any]:
    """Write one file as TorchCheckpointEngine.save does (its bytes counted as progress), fsync it;
    its manifest entry. `after_chunk`: a TEST-ONLY fault hook (trainer.faults)."""
    save_counted(state, path, serialization, after_chunk)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
    return {"size": path.stat().st_size, "sha256": sha256_counted(path, Mark.SAVE_BYTES)}


class AsyncCheckpointer:
    """One per rank, created by every rank at the same point (it creates a process group)."""

    def __init__(self, faults=None, local_copies=None) -> None:
        self.rank, self.world = dist_world()
        # The writer's own group: gloo works for CPU objects on any backend's job.
        self.group = tdist.new_group(backend="gloo") if self.world > 1 else None
        # trainer.local_save.LocalCopies (checkpoint.local_dir), or None: made with the group.
        self.local = local_copies(self.group) if local_copies is not None else None
        self.faults = faults
        self.thread: threading.Thread | None = None
        self.in_flight: str | None = None
        self.last_ok: bool | None = None
        self.buffers: list[torch.Tensor] = []  # the last snapshot's host tensors, reused by the next

    def save(self, engine, paths: RunPaths, step: int, client_state: dict[str, Any], keep_last: int,
             job_id: str = "", extra_client_state: dict[str, Any] | None = None,
             layout: dict[str, int] | None = None, **save_options: Any) -> Path:
        """Collective. Returns once this rank's state is on the host (the stall training sees);
        the files, MANIFEST and `latest` follow in the background. `save_options`: those of
        trainer.checkpoint.save_checkpoint (json_files, before_write)."""
        if self.in_flight:
            since, previous = time.time(), self.in_flight
            self.wait()
            if self.rank == 0 and time.time() - since > 0.01:
                print(f"[trainer] waited {time.time() - since:.3f}s for the background write of {previous} "
                      "before the next save", flush=True)
        real = engine.checkpoint_engine
        serialization = bool(getattr(real, "zipfile_serialization", True))
        hook = None if self.faults is None else (lambda: self.faults.at_checkpoint("snapshot", step))
        snap = HostSnapshotEngine(serialization, hook, reuse=self.buffers)
        self.buffers = []  # (an exception below must not leave them half overwritten for reuse)
        engine.checkpoint_engine = snap
        try:
            ckpt_dir = ckpt.save_checkpoint(engine, paths, step, client_state, keep_last, job_id,
                                            extra_client_state=extra_client_state, layout=layout, seal=False,
                                            **save_options)
        finally:
            engine.checkpoint_engine = real
        snap.snapshot.synchronize()
        self.buffers = snap.snapshot.buffers
        meta = {"step": step, "world_size": self.world, "job_id": job_id, "layout": layout or {}}
        self.in_flight = ckpt_dir.name
        self.thread = threading.Thread(
            target=self._write, args=(paths, ckpt_dir, snap.files, serialization, meta, keep_last, step),
            name=f"checkpoint-writer-{ckpt_dir.name}", daemon=True,
        )
        self.thread.start()
        return ckpt_dir

    def wait(self) -> bool | None:
        """Block until the write in flight (if any) is sealed or failed; True when it was sealed,
        None when nothing was in flight."""
        if self.thread is None:
            return None
        self.thread.join()
        self.thread = None
        self.in_flight = None
        return self.last_ok

    def _write(self, paths: RunPaths, ckpt_dir: Path, files: list[tuple[str, Any]], serialization: bool,
               meta: dict[str, Any], keep_last: int, step: int) -> None:
        started = time.time()
        mine: dict[str, dict[str, Any]] = {}
        error = None
        try:
            for index in range(len(files)):
                if self.faults is not None:
                    self.faults.at_checkpoint("write", step, files_written=index)
                path = Path(files[index][0])
                after_chunk = None if self.faults is None else self.faults.save_chunk_hook()
                rel = str(path.relative_to(ckpt_dir))
                mine[rel] = persist(path, files[index][1], serialization, after_chunk)
                if self.local is not None:
                    self.local.keep_own(step, rel, files[index][1], serialization, mine[rel])
            for directory in {ckpt_dir.parent, ckpt_dir, *((ckpt_dir / rel).parent for rel in mine)}:
                fsync_dir(directory)  # the new names are durable too, not just the bytes
        except Exception as exc:  # reported to rank 0, which then does not seal
            error = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        reports = [(error, mine)]
        if self.group is not None:
            reports = [None] * self.world
            try:
                with waiting():  # this rank's files are written: the time here is its peers'
                    tdist.all_gather_object(reports, (error, mine), group=self.group)
            except Exception as exc:  # a peer died: the job is going down, nothing is sealed
                self.last_ok = False
                print(f"[checkpoint] {ckpt_dir.name} NOT sealed: the writers' handshake failed ({exc}); "
                      f"`latest` stays on the previous checkpoint", file=sys.stderr, flush=True)
                return
        errors = [e for e, _ in reports if e]
        self.last_ok = not errors
        sealed = self.rank == 0 and self._seal_reported(paths, ckpt_dir, reports, meta, keep_last, errors, started)
        if self.local is not None:  # every rank: it is collective over the writers' group
            try:
                self.local.after_seal(self.group, ckpt_dir, step, reports, sealed, step)
            except Exception as exc:  # the shared copy is sealed or not regardless: never fail the save
                print(f"[checkpoint] rank {self.rank}: local copies of {ckpt_dir.name} not kept: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)

    def _seal_reported(self, paths: RunPaths, ckpt_dir: Path, reports, meta: dict[str, Any], keep_last: int,
                       errors: list[str], started: float) -> bool:
        """Rank 0: seal when every rank wrote its files; True once sealed."""
        if errors:
            print(f"[checkpoint] {ckpt_dir.name} NOT sealed (no MANIFEST, `latest` unchanged): "
                  f"{'; '.join(errors[:4])}", file=sys.stderr, flush=True)
            return False
        try:
            self._seal(paths, ckpt_dir, reports, meta, keep_last)
        except Exception as exc:
            self.last_ok = False
            print(f"[checkpoint] {ckpt_dir.name} NOT sealed: {type(exc).__name__}: {exc}", file=sys.stderr,
                  flush=True)
            return False
        print(f"[trainer] wrote and sealed {ckpt_dir.name} in the background in {time.time() - started:.1f}s",
              flush=True)
        return True

    @staticmethod
    def _seal(paths: RunPaths, ckpt_dir: Path, reports, meta: dict[str, Any], keep_last: int) -> None:
        """Rank 0, once every rank's files are on disk: MANIFEST last, then `latest`, then cleanup."""
        entries: dict[str, dict[str, Any]] = {}
        for _, part in reports:
            entries.update(part)
        listing = list_files(ckpt_dir)
        missing = sorted(set(entries) - set(listing))
        if missing:
            raise RuntimeError(f"written files not visible to rank 0: {missing[:5]}")
        for rel in listing:  # files written directly in the save (e.g. DeepSpeed's zero_to_fp32.py)
            if rel not in entries:
                path = ckpt_dir / rel
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
                entries[rel] = {"size": path.stat().st_size, "sha256": sha256_counted(path, Mark.SAVE_BYTES)}
        seal_checkpoint(paths.checkpoints, ckpt_dir, entries, meta, keep_last)
