"""Megatron's mmap indexed dataset (`.bin` + `.idx`, version 1), written and read by our own code.

Byte layout of `<prefix>.idx` (all little endian), the same as Megatron-LM's `MMapIndexedDataset`:

    offset  size          field
    0       9             magic b"MMIDIDX\\x00\\x00"
    9       8  <Q         version, always 1
    17      1  <B         dtype code of the tokens in .bin (see DTYPE_CODES)
    18      8  <Q         number of sequences N (one sequence per document here)
    26      8  <Q         number of entries D of the document index (documents + 1)
    34      4*N int32     sizes: tokens per sequence
    ..      8*N int64     pointers: byte offset of each sequence in .bin
    ..      8*D int64     doc_idx: sequence index where each document starts, starting with 0

`<prefix>.bin` is the token ids of all sequences back to back, in the dtype named by the code.
"""

from __future__ import annotations

import os
import struct
from array import array
from pathlib import Path
from types import TracebackType

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
_HEADER_SIZE = len(INDEX_MAGIC) + 8 + 1 + 8 + 8  # 34 bytes before the sizes array

# Megatron's dtype codes. Codes 1-5 and 8 never changed. Old Megatron mapped 6 to `np.float` (an
# alias of float64) and 7 to `np.double` (float64 too, so its writer only ever produced 6 for
# float64); Megatron core maps 6 -> float64 and 7 -> float32. The table below reads every file
# either of them wrote. Token files only ever use uint16 (8) or int32 (4).
DTYPE_CODES: dict[int, type[np.generic]] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF_DTYPE = {np.dtype(dtype): code for code, dtype in DTYPE_CODES.items()}


def dtype_code(dtype: np.dtype | type) -> int:
    try:
        return _CODE_OF_DTYPE[np.dtype(dtype)]
    except KeyError:
        raise ValueError(
            f"dtype {np.dtype(dtype)} has no Megatron dtype code; use one of "
            f"{sorted(str(np.dtype(d)) for d in DTYPE_CODES.values())}"
        ) from None


def best_fitting_dtype(vocab_size: int | None) -> type[np.generic]:
    """uint16 when every token id fits (Megatron's threshold: vocab < 65500), else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.uint16
    return np.int32


def index_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.idx")


def data_path(prefix: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(prefix)}.bin")


def write_index(path: Path, dtype: np.dtype | type, sizes: np.ndarray, doc_idx: np.ndarray) -> None:
    """Write a `.idx` file for `sizes` (tokens per sequence) and `doc_idx` (document starts)."""
    sizes = np.asarray(sizes)
    if sizes.size and (sizes.min() < 0 or sizes.max() > np.iinfo(np.int32).max):
        raise ValueError("sequence sizes must fit in int32 (Megatron stores them as int32)")
    itemsize = np.dtype(dtype).itemsize
    # pointers[i] = byte offset of sequence i = itemsize * sum(sizes[:i]).
    pointers = np.zeros(len(sizes), dtype=np.int64)
    if len(sizes) > 1:
        np.cumsum(sizes[:-1], dtype=np.int64, out=pointers[1:])
    pointers *= itemsize
    with open(path, "wb") as handle:
        handle.write(INDEX_MAGIC)
        handle.write(struct.pack("<Q", INDEX_VERSION))
        handle.write(struct.pack("<B", dtype_code(dtype)))
        handle.write(struct.pack("<Q", len(sizes)))
        handle.write(struct.pack("<Q", len(doc_idx)))
        handle.write(np.asarray(sizes, dtype="<i4").tobytes(order="C"))
        handle.write(pointers.astype("<i8", copy=False).tobytes(order="C"))
        handle.write(np.asarray(doc_idx, dtype="<i8").tobytes(order="C"))
        handle.flush()
        os.fsync(handle.fileno())


class IndexedDatasetBuilder:
    """Appends documents to `<prefix>.bin` and writes `<prefix>.idx` on `finalize()`.

    Writes go to `<prefix>.bin.tmp`/`.idx.tmp` and are renamed at the end, so a crashed
    preprocessing run never leaves a `.bin`/`.idx` pair that looks complete.
    """

    def __init__(self, prefix: str | os.PathLike[str], dtype: np.dtype | type) -> None:
        self.prefix = os.fspath(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # fail early on a dtype Megatron cannot name
        self._bin_tmp = Path(f"{data_path(self.prefix)}.tmp")
        self._bin_tmp.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(self._bin_tmp, "wb")  # noqa: SIM115 - closed in finalize()
        # array('i'): 4 bytes a document (a list of Python ints would take ~30 at 350M documents).
        self._sizes = array("i")
        self._limit = np.iinfo(self.dtype).max if self.dtype.kind in "iu" else None

    def add_document(self, token_ids: np.ndarray | list[int]) -> None:
        """One document = one sequence (Megatron's preprocessing without sentence splitting)."""
        tokens = np.asarray(token_ids)
        if self._limit is not None and tokens.size and (tokens.max() > self._limit or tokens.min() < 0):
            raise ValueError(
                f"token id {int(tokens.max())} does not fit in {self.dtype}; use int32 for vocabularies "
                f">= 65500 (best_fitting_dtype)"
            )
        self._bin.write(tokens.astype(self.dtype, copy=False).tobytes(order="C"))
        self._sizes.append(int(tokens.size))

    def finalize(self) -> None:
        self._bin.flush()
        os.fsync(self._bin.fileno())
        self._bin.close()
        idx_tmp = Path(f"{index_path(self.prefix)}.tmp")
        sizes = np.frombuffer(self._sizes, dtype=np.int32) if self._sizes else np.zeros(0, dtype=np.int32)
        # One sequence per document: document i starts at sequence i.
        write_index(idx_tmp, self.dtype, sizes, np.arange(len(sizes) + 1, dtype=np.int64))
        os.replace(self._bin_tmp, data_path(self.prefix))
        os.replace(idx_tmp, index_path(self.prefix))

    @property
    def num_documents(self) -> int:
        return len(self._sizes)

    @property
    def num_tokens(self) -> int:
        return int(np.frombuffer(self._sizes, dtype=np.int32).sum(dtype=np.int64)) if self._sizes else 0


class MMapIndexedDataset:
    """Reads a Megatron `.bin`/`.idx` pair through memory maps; nothing is loaded eagerly.

    `ds[i]` is sequence i (a read-only numpy view); `ds.get(i, offset, length)` a part of it.
    Pickles as its path, so DataLoader workers reopen the maps instead of copying them.
    """

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self._open(os.fspath(prefix))

    def _open(self, prefix: str) -> None:
        self.prefix = prefix
        idx_file, bin_file = index_path(prefix), data_path(prefix)
        for path in (idx_file, bin_file):
            if not path.is_file():
                raise FileNotFoundError(
                    f"{path} does not exist: a dataset prefix names a pair <prefix>.bin/<prefix>.idx; "
                    f"build it with `python -m trainer.data.preprocess`"
                )
        with open(idx_file, "rb") as handle:
            header = handle.read(_HEADER_SIZE)
        if len(header) < _HEADER_SIZE or header[:9] != INDEX_MAGIC:
            raise ValueError(f"{idx_file} is not a Megatron mmap index (magic {header[:9]!r} != {INDEX_MAGIC!r})")
        (version,) = struct.unpack("<Q", header[9:17])
        if version != INDEX_VERSION:
            raise ValueError(f"{idx_file}: index version {version} is not supported (only 1)")
        (code,) = struct.unpack("<B", header[17:18])
        if code not in DTYPE_CODES:
            raise ValueError(f"{idx_file}: unknown dtype code {code}, known: {sorted(DTYPE_CODES)}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        num_sequences, num_doc_idx = struct.unpack("<QQ", header[18:34])
        self._idx_map = np.memmap(idx_file, mode="r", dtype=np.uint8)
        offset = _HEADER_SIZE
        self.sizes = np.frombuffer(self._idx_map, dtype="<i4", count=num_sequences, offset=offset)
        offset += self.sizes.nbytes
        self.pointers = np.frombuffer(self._idx_map, dtype="<i8", count=num_sequences, offset=offset)
        offset += self.pointers.nbytes
        self.doc_idx = np.frombuffer(self._idx_map, dtype="<i8", count=num_doc_idx, offset=offset)
        expected = offset + self.doc_idx.nbytes
        if expected != self._idx_map.size:
            raise ValueError(f"{idx_file}: {self._idx_map.size} bytes but the header implies {expected}; truncated?")
        bin_size = os.path.getsize(bin_file)
        needed = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if num_sequences else 0
        if bin_size < needed:
            raise ValueError(f"{bin_file}: {bin_size} bytes but the index points up to byte {needed}; truncated?")
        # An empty memmap is not allowed by numpy: keep None for an empty .bin.
        self._bin_map = np.memmap(bin_file, mode="r", dtype=self.dtype) if bin_size else None

    def __getstate__(self) -> str:
        return self.prefix

    def __setstate__(self, state: str) -> None:
        self._open(state)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens [offset, offset+length) of sequence i (to its end when length is None)."""
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"sequence {i} has {size} tokens; asked for [{offset}, {offset + length})")
        if length == 0:
            return np.empty(0, dtype=self.dtype)
        start = int(self.pointers[i]) // self.dtype.itemsize + offset
        return self._bin_map[start : start + length]

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.sum(dtype=np.int64))

    def __enter__(self) -> MMapIndexedDataset:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._bin_map = None
        self._idx_map = None
