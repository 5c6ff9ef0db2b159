"""Index arrays on disk under `<run_dir>/data_cache/`: built once by one rank, memory-mapped by all.

A cache entry is `<stem>_<array>.npy` for each array plus `<stem>.json`, the completion marker,
written last. `<stem>` encodes the parameters readably and ends with a hash of all of them
(dataset path, its .idx/.bin size and mtime, split, document range, samples, sequence length,
seed, algorithm version), so a changed dataset or setting never reuses stale indices.

Every file is written to a private temp name, fsynced, then renamed: two builders racing on the
same entry (a restarted job while the old one is still dying, two jobs sharing a cache) each
produce complete identical files and the renames replace whole files atomically; a reader that
sees the marker sees complete arrays.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.contract import atomic_write_json, fsync_dir

# Bump when the index algorithms change so old caches are not reused with new semantics.
INDEX_ALGORITHM_VERSION = 1


class IndexCacheMissing(FileNotFoundError):
    """The arrays are not in the cache and this rank must not build them."""


@dataclass(frozen=True)
class CacheEntry:
    cache_dir: Path
    stem: str
    params: dict[str, Any]

    def array_path(self, name: str) -> Path:
        return self.cache_dir / f"{self.stem}_{name}.npy"

    @property
    def marker(self) -> Path:
        return self.cache_dir / f"{self.stem}.json"


def dataset_fingerprint(prefix: str | os.PathLike[str]) -> dict[str, Any]:
    """Path, size and mtime of the .idx/.bin pair: changes whenever the dataset is rewritten."""
    fingerprint: dict[str, Any] = {"prefix": str(Path(prefix).resolve())}
    for suffix in (".idx", ".bin"):
        stat = os.stat(f"{os.fspath(prefix)}{suffix}")
        fingerprint[suffix] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return fingerprint


def cache_entry(cache_dir: Path, label: str, params: dict[str, Any], readable: str) -> CacheEntry:
    """`label` (e.g. the dataset name and split) and `readable` (e.g. "1000ns_2048sl_1234s") make
    the name legible; the hash makes it exact."""
    full = {"algorithm_version": INDEX_ALGORITHM_VERSION, **params}
    digest = hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()[:16]
    safe_label = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
    return CacheEntry(Path(cache_dir), f"{safe_label}_{readable}_{digest}", full)


class NpyStreamWriter:
    """Writes a .npy file whose rows arrive in blocks, to a temp name; `commit()` renames it.

    Streaming keeps the resident memory of a multi-GB array at one block (np.save needs the
    whole array; a writable memmap would count every written page in RSS).
    """

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.path, self.dtype, self.shape = path, np.dtype(dtype), shape
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        self._handle = open(self.tmp, "wb")  # noqa: SIM115 - closed in commit()/abort()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(self._handle, header)
        self._expected = int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize
        self._written = 0

    def write(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self._handle.write(memoryview(block).cast("B"))
        self._written += block.nbytes

    def commit(self) -> None:
        if self._written != self._expected:
            self.abort()
            raise RuntimeError(f"{self.path}: wrote {self._written} bytes of data, expected {self._expected}")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self._handle.closed:
            self._handle.close()
        self.tmp.unlink(missing_ok=True)


def write_array(path: Path, array: np.ndarray) -> NpyStreamWriter:
    """Writes `array` to a temp file; the caller commits (fsync + rename) or aborts it."""
    return write_blocks(path, array.dtype, array.shape, [array])


def write_blocks(path: Path, dtype: np.dtype, shape: tuple[int, ...], blocks: Iterable[np.ndarray]) -> NpyStreamWriter:
    writer = NpyStreamWriter(path, dtype, shape)
    try:
        for block in blocks:
            writer.write(block)
    except BaseException:
        writer.abort()
        raise
    return writer


def save_array(path: Path, array: np.ndarray) -> None:
    writer = write_array(path, array)
    try:
        writer.commit()
    except BaseException:
        writer.abort()
        raise


def is_complete(entry: CacheEntry, names: Iterable[str]) -> bool:
    return entry.marker.is_file() and all(entry.array_path(name).is_file() for name in names)


def load_arrays(entry: CacheEntry, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Memory-maps the arrays of a complete entry (read-only: the pages are shared by all ranks)."""
    marker = json.loads(entry.marker.read_text())
    arrays = {}
    for name in names:
        array = np.load(entry.array_path(name), mmap_mode="r")
        expected = tuple(marker["shapes"][name])
        if array.shape != expected:
            raise ValueError(
                f"{entry.array_path(name)} has shape {array.shape} but its marker says {expected}: the "
                f"cache entry is damaged; delete {entry.cache_dir}/{entry.stem}* and rerun"
            )
        arrays[name] = array
    return arrays


def load_or_build(
    entry: CacheEntry,
    names: tuple[str, ...],
    build: Callable[[CacheEntry], dict[str, tuple[int, ...]]],
    build_on_this_rank: bool,
) -> tuple[dict[str, np.ndarray], bool]:
    """Returns (arrays, built): memory-maps an existing entry, or builds it when allowed.

    `build(entry)` must write every array with save_array/save_blocks and return their shapes;
    the marker is written after it returns.
    """
    if not is_complete(entry, names):
        if not build_on_this_rank:
            raise IndexCacheMissing(
                f"index cache {entry.marker} is missing and this rank does not build it. The building rank "
                f"(build_on_this_rank=True, rank 0) must run first and finish before a barrier; check that "
                f"all ranks use the same cache_dir ({entry.cache_dir}) on a shared filesystem"
            )
        entry.cache_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        shapes = build(entry)
        fsync_dir(entry.cache_dir)
        record = {"params": entry.params, "shapes": {k: list(v) for k, v in shapes.items()},
                  "build_seconds": round(time.monotonic() - started, 3), "built_by_pid": os.getpid()}
        atomic_write_json(entry.marker, record)
        return load_arrays(entry, names), True
    return load_arrays(entry, names), False
