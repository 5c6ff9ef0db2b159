"""Checkpoint bytes counted as they move: every chunk written, read or hashed is a mark
(orchestrator/contract/client/progress.py), so a save or a load whose bytes still move is never taken for a hang, and one
whose bytes stop is.

torch.save writes through `CountingWriter` (a file object: torch's stream writer), torch.load
reads through `CountingReader`. Large writes and reads go in CHUNK_BYTES pieces, each a mark:
one tensor of a BLOOM shard is gigabytes, minutes on a slow filesystem. DeepSpeed writes and reads
through `engine.checkpoint_engine`, which `install_counting_checkpoint_engine` replaces with
`CountingCheckpointEngine` (the same torch.save/torch.load calls, counted).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

from orchestrator.contract import Mark
from orchestrator.contract.client.progress import mark

CHUNK_BYTES = 64 << 20  # a mark at least every 64 MiB: about 1 s at a slow 64 MB/s


class CountingWriter:
    """A binary file for torch.save: writes through to `handle`, a mark per chunk. No fileno():
    torch's legacy writer would write around it. `after_chunk`: a TEST-ONLY fault hook."""

    def __init__(self, handle, unit: Mark = Mark.SAVE_BYTES, after_chunk: Callable[[], None] | None = None,
                 chunk: int = CHUNK_BYTES):
        self.handle, self.unit, self.after_chunk, self.chunk = handle, unit, after_chunk, chunk
        self.bytes = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), self.chunk):
            piece = view[start:start + self.chunk]
            self.handle.write(piece)
            self.bytes += len(piece)
            mark(self.unit)
            if self.after_chunk is not None:
                self.after_chunk()
        return len(view)

    def flush(self) -> None:
        self.handle.flush()

    def tell(self) -> int:
        return self.handle.tell()


class CountingReader:
    """A binary file for torch.load (seekable), a mark per chunk read."""

    def __init__(self, handle, unit: Mark = Mark.LOAD_BYTES, chunk: int = CHUNK_BYTES):
        self.handle, self.unit, self.chunk = handle, unit, chunk
        self.bytes = 0

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view):
            got = self.handle.readinto(view[done:done + self.chunk])
            if not got:
                break
            done += got
            mark(self.unit)
        self.bytes += done
        return done

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.bytes += len(data)
        mark(self.unit)
        return data

    def readline(self, size: int = -1) -> bytes:  # torch's legacy (non-zip) format pickles from the file
        data = self.handle.readline(size)
        self.bytes += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.handle.seek(offset, whence)

    def tell(self) -> int:
        return self.handle.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def save_counted(state: Any, path: str | Path, zipfile_serialization: bool = True,
                 after_chunk: Callable[[], None] | None = None) -> int:
    """torch.save(state, path) with its bytes counted; returns how many were written."""
    with open(path, "wb") as handle:
        writer = CountingWriter(handle, after_chunk=after_chunk)
        torch.save(state, writer, _use_new_zipfile_serialization=zipfile_serialization)
    return writer.bytes


def load_counted(path: str | Path, map_location=None, weights_only: bool = False) -> Any:
    with open(path, "rb") as handle:
        return torch.load(CountingReader(handle), map_location=map_location, weights_only=weights_only)


class CountingCheckpointEngine(TorchCheckpointEngine):
    """DeepSpeed's TorchCheckpointEngine (same serialization, same files' content), counted.
    `after_chunk`: a TEST-ONLY fault hook (trainer.faults), called after each written chunk."""

    def __init__(self, zipfile_serialization: bool, after_chunk: Callable[[], None] | None = None):
        super().__init__(None)
        self.zipfile_serialization = zipfile_serialization
        self.after_chunk = after_chunk

    def save(self, state_dict, path: str) -> None:
        save_counted(state_dict, path, self.zipfile_serialization, self.after_chunk)

    def load(self, path: str, map_location=None):
        return load_counted(path, map_location=map_location)

    def commit(self, info) -> bool:
        # DeepSpeed calls it once this rank's files of the save are written, right before its
        # closing barrier: the time from here is the peers'.
        mark(Mark.WAIT)
        return super().commit(info)


def install_counting_checkpoint_engine(engine, after_chunk: Callable[[], None] | None = None) -> bool:
    """Count what DeepSpeed saves and loads through `engine`. Only over its plain torch engine: any
    other (a decoupled or vendor engine) keeps its own I/O, uncounted, and says so."""
    current = getattr(engine, "checkpoint_engine", None)
    if type(current) is not TorchCheckpointEngine:
        print(f"[trainer] checkpoint engine {type(current).__name__}: its bytes are not counted as progress "
              "(a long save shows as no progress)", file=sys.stderr, flush=True)
        return False
    engine.checkpoint_engine = CountingCheckpointEngine(bool(current.zipfile_serialization), after_chunk)
    return True
