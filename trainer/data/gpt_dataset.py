"""GPT pretraining samples of seq_length+1 tokens from one Megatron indexed dataset.

`GPTDataset(i)` reads shuffled sample i through the three cached index arrays (sample_index.py)
and returns `{"text": int64 [seq_length + 1]}`: inputs are text[:-1], labels text[1:].
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from trainer.data import sample_index as si
from trainer.data.index_cache import (
    CacheEntry,
    cache_entry,
    dataset_fingerprint,
    load_or_build,
    save_array,
    write_array,
    write_blocks,
)
from trainer.data.indexed_dataset import MMapIndexedDataset

log = logging.getLogger(__name__)

INDEX_NAMES = ("doc_idx", "sample_idx", "shuffle_idx")


def parse_split(split: str) -> list[float]:
    """"949,50,1" (or "949/50/1", or "98") -> three non-negative weights, padded with zeros."""
    separator = "," if "," in split else "/"
    try:
        weights = [float(part) for part in split.split(separator)]
    except ValueError:
        raise ValueError(f"split {split!r} must be numbers like '949,50,1' (train,valid,test)") from None
    if len(weights) > 3 or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"split {split!r} needs 1 to 3 non-negative weights with a positive sum")
    return weights + [0.0] * (3 - len(weights))


def split_document_ranges(split: str, num_documents: int) -> list[int]:
    """Megatron's `get_train_valid_test_split_`: 4 boundaries [0, a, b, num_documents] of the
    train/valid/test document ranges, each share rounded, the rounding error taken off the ends."""
    weights = parse_split(split)
    total = sum(weights)
    bounds = [0]
    for weight in weights:
        bounds.append(bounds[-1] + int(round(weight / total * float(num_documents))))
    diff = bounds[-1] - num_documents
    return [bounds[0]] + [b - diff for b in bounds[1:]]


class GPTDataset:
    def __init__(
        self,
        name: str,
        indexed: MMapIndexedDataset,
        documents: np.ndarray | range,
        num_samples: int,
        seq_length: int,
        seed: int,
        cache_dir: Path,
        build_on_this_rank: bool,
    ) -> None:
        if len(documents) == 0:
            raise ValueError(f"{name}: no documents in this split")
        if num_samples <= 0 or seq_length <= 0:
            raise ValueError(f"{name}: num_samples ({num_samples}) and seq_length ({seq_length}) must be > 0")
        if not isinstance(documents, range):
            # A split is a contiguous range of documents, and the cache key records only its ends.
            array = np.asarray(documents)
            if not np.array_equal(array, np.arange(int(array[0]), int(array[0]) + len(array))):
                raise ValueError(f"{name}: documents must be a contiguous increasing range of document ids")
            documents = range(int(array[0]), int(array[0]) + len(array))
        if documents.step != 1 or documents.stop > len(indexed):
            raise ValueError(f"{name}: documents {documents} are not a contiguous range of the {len(indexed)} documents")
        self.name, self.indexed, self.seq_length = name, indexed, seq_length
        self.documents = documents
        first, last = documents.start, documents.stop - 1
        params = {
            "dataset": dataset_fingerprint(indexed.prefix),
            "split": name, "documents": [first, last + 1],
            "num_samples": int(num_samples), "seq_length": int(seq_length), "seed": int(seed),
        }
        label = f"{Path(indexed.prefix).name}_{name}"
        readable = f"{num_samples}ns_{seq_length}sl_{seed}s"
        self.cache_entry = cache_entry(cache_dir, label, params, readable)
        started = time.monotonic()
        arrays, self.index_built = load_or_build(
            self.cache_entry, INDEX_NAMES,
            lambda entry: self._build(entry, num_samples, seed),
            build_on_this_rank,
        )
        self.doc_idx, self.sample_idx, self.shuffle_idx = (arrays[n] for n in INDEX_NAMES)
        log.info("%s: %s index of %d samples in %.2fs (%s)", name, "built" if self.index_built else "loaded",
                 len(self), time.monotonic() - started, self.cache_entry.marker)

    def _build(self, entry: CacheEntry, num_samples: int, seed: int) -> dict[str, tuple[int, ...]]:
        return build_index_files(entry, self.indexed.sizes, self.documents, num_samples, self.seq_length, seed)

    def __len__(self) -> int:
        # Every sample the epochs hold (>= the num_samples asked), as Megatron.
        return self.sample_idx.shape[0] - 1

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        if not -len(self) <= idx < len(self):
            raise IndexError(f"sample {idx} out of range for {self.name} with {len(self)} samples")
        sample = int(self.shuffle_idx[idx])
        doc_first, offset_first = (int(x) for x in self.sample_idx[sample])
        doc_last, offset_last = (int(x) for x in self.sample_idx[sample + 1])
        get, doc_idx = self.indexed.get, self.doc_idx
        if doc_first == doc_last:
            tokens = get(int(doc_idx[doc_first]), offset_first, offset_last - offset_first + 1)
            return {"text": tokens.astype(np.int64)}
        parts = [get(int(doc_idx[doc_first]), offset_first)]
        parts.extend(get(int(doc_idx[i])) for i in range(doc_first + 1, doc_last))
        parts.append(get(int(doc_idx[doc_last]), 0, offset_last + 1))
        return {"text": np.concatenate(parts).astype(np.int64)}


def build_index_files(entry: CacheEntry, sizes: np.ndarray, documents: np.ndarray | range, num_samples: int,
                      seq_length: int, seed: int, timings: dict | None = None) -> dict[str, tuple[int, ...]]:
    """Builds doc_idx, sample_idx and shuffle_idx and saves them under `entry`; returns their shapes
    (and fills `timings`, if given, with the epoch and sample counts, the wall time from the start
    to the end of each array (`*_s`) and the CPU time of the thread that built it (`*_cpu_s`)).

    shuffle_idx depends only on the sample count, so a second thread builds it while this one
    shuffles the documents and walks them for sample_idx (numpy's shuffle, sort and take release
    the GIL). Each file's fsync runs in the background while the next array is computed. Peak
    memory ~ sizes + doc_idx + shuffle_idx + one chunk: sample_idx streams to disk.
    """
    tokens_per_epoch = si.num_tokens(documents, sizes)
    epochs = si.num_epochs_needed(tokens_per_epoch, seq_length, num_samples)
    separate_last = si.use_separate_last_epoch(epochs, tokens_per_epoch, seq_length, num_samples)
    total_samples = si.samples_in(epochs, tokens_per_epoch, seq_length)
    num_first = si.samples_in(epochs - 1, tokens_per_epoch, seq_length) if separate_last else total_samples
    # Two independent streams from the seed: the result does not depend on thread timing.
    doc_rng, shuffle_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    timings = {} if timings is None else timings
    timings.update(epochs=epochs, samples=total_samples, separate_last_epoch=separate_last)
    started = time.monotonic()

    def shuffle_job() -> tuple[int, ...]:
        cpu = time.thread_time()
        shuffle_idx = si.build_shuffle_idx(num_first, total_samples, shuffle_rng)
        save_array(entry.array_path("shuffle_idx"), shuffle_idx)
        timings["shuffle_idx_s"] = time.monotonic() - started
        timings["shuffle_idx_cpu_s"] = time.thread_time() - cpu
        return shuffle_idx.shape

    writers = []
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="data-index") as pool:
        shuffle_done = pool.submit(shuffle_job)
        try:
            cpu = time.thread_time()
            doc_idx = si.build_doc_idx(documents, epochs, doc_rng)
            writers.append(write_array(entry.array_path("doc_idx"), doc_idx))
            commits = [pool.submit(writers[-1].commit)]
            timings["doc_idx_s"] = time.monotonic() - started
            timings["doc_idx_cpu_s"] = time.thread_time() - cpu
            cpu = time.thread_time()
            dtype = si.sample_idx_dtype(len(doc_idx), int(sizes.max()))
            writers.append(write_blocks(entry.array_path("sample_idx"), dtype, (total_samples + 1, 2),
                                        si.iter_sample_idx_chunks(sizes, doc_idx, seq_length, total_samples)))
            commits.append(pool.submit(writers[-1].commit))
            doc_idx_shape = doc_idx.shape
            del doc_idx
            timings["sample_idx_s"] = time.monotonic() - started
            timings["sample_idx_cpu_s"] = time.thread_time() - cpu
            shuffle_shape = shuffle_done.result()
            for commit in commits:
                commit.result()
        except BaseException:
            for writer in writers:
                writer.abort()
            raise
    timings["total_s"] = time.monotonic() - started
    log.info("index build of %s: %s", entry.stem, timings)
    return {"doc_idx": doc_idx_shape, "sample_idx": (total_samples + 1, 2), "shuffle_idx": shuffle_shape}


def build_split_datasets(
    prefix: str,
    split: str,
    num_samples: tuple[int, int, int],
    seq_length: int,
    seed: int,
    cache_dir: Path,
    build_on_this_rank: bool,
) -> list[GPTDataset | None]:
    """Train/valid/test GPTDatasets of one indexed dataset; None where a split has no documents
    or no samples are asked."""
    indexed = MMapIndexedDataset(prefix)
    bounds = split_document_ranges(split, len(indexed))
    datasets: list[GPTDataset | None] = []
    for index, name in enumerate(("train", "valid", "test")):
        start, stop = bounds[index], bounds[index + 1]
        if stop <= start or num_samples[index] <= 0:
            if num_samples[index] > 0:
                log.warning("%s: split %r leaves no %s documents of %d; no %s dataset", prefix, split, name,
                            len(indexed), name)
            datasets.append(None)
            continue
        datasets.append(GPTDataset(name, indexed, range(start, stop), num_samples[index], seq_length, seed,
                                   cache_dir, build_on_this_rank))
    return datasets
