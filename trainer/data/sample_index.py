"""The three index arrays of a GPT dataset, built with vectorised numpy (Megatron uses C++).

- doc_idx [num_epochs * num_docs] int32: the documents in reading order. Each epoch is its own
  random permutation of the documents, so every document is read once per epoch. (Megatron
  shuffles the first epochs as one pool; the issue asks for a per-epoch order, which is also a
  stronger guarantee of uniform exposure.)
- sample_idx [num_samples + 1, 2]: for sample i, the (position in doc_idx, token offset) where it
  starts; sample i spans the token stream from start(i) to start(i+1) inclusive, i.e. seq+1
  tokens, and sample i+1 starts on the last token of sample i (the label of one position is the
  input of the next). Same layout and values as Megatron's `build_sample_idx`.
- shuffle_idx [num_samples]: the order in which samples are served. When the last epoch is short
  (< 80% of an epoch, Megatron's `separate_last_epoch`), the samples of the full epochs are
  shuffled among themselves and the last epoch's samples among themselves, after them, so that a
  partial epoch is not mixed into (and does not dilute) the full ones.

The vectorised sample_idx: put the documents of doc_idx end to end as one token stream; sample
boundary k sits at stream position k*seq_length, in the document j with start_j <= k*seq < end_j,
i.e. ceil(start_j/seq) <= k < ceil(end_j/seq), so each document holds a computable number of
boundaries and `np.repeat` lays them out (sequential passes; no per-boundary binary search).
Documents are processed in chunks so that only one chunk's int64 cumulative sums are in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from trainer.data.shuffle import shuffled_values

DOC_CHUNK = 1 << 22  # documents per step of the sample_idx build (4M: ~100 MB of int64 temporaries)
LAST_EPOCH_FRACTION = 0.80  # Megatron's threshold for shuffling a short last epoch separately


Documents = "np.ndarray | range"  # a split is a contiguous range; a range costs no memory at 350M docs


def num_tokens(documents: np.ndarray | range, sizes: np.ndarray) -> int:
    """Tokens in one epoch: the sum of the sizes of `documents`."""
    if isinstance(documents, range) and documents.step == 1:
        return int(np.sum(sizes[documents.start : documents.stop], dtype=np.int64))
    return int(np.sum(sizes[np.asarray(documents)], dtype=np.int64))


def num_epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Smallest number of epochs giving `num_samples` samples: (epochs*T - 1) // seq >= num_samples.

    The -1: each sample needs seq+1 tokens but shares its last one with the next sample.
    """
    if tokens_per_epoch <= 1:
        raise ValueError(f"a dataset with {tokens_per_epoch} tokens cannot give any sample")
    needed = num_samples * seq_length + 1
    return max(1, -(-needed // tokens_per_epoch))


def samples_in(epochs: int, tokens_per_epoch: int, seq_length: int) -> int:
    return (epochs * tokens_per_epoch - 1) // seq_length


def use_separate_last_epoch(num_epochs: int, tokens_per_epoch: int, seq_length: int, num_samples: int) -> bool:
    """Megatron's rule: separate the last epoch when it supplies < 80% of an epoch's samples."""
    if num_epochs == 1:
        return False
    from_full_epochs = samples_in(num_epochs - 1, tokens_per_epoch, seq_length)
    last_epoch_samples = num_samples - from_full_epochs
    per_epoch = (tokens_per_epoch - 1) // seq_length
    # The last epoch can give one sample more than (T-1)//seq: the epochs before it end with a
    # partial sample that it completes. (Megatron asserts < per_epoch + 1 here and fails on it.)
    if not 0 <= last_epoch_samples <= per_epoch + 1:
        raise AssertionError(f"last epoch samples {last_epoch_samples} outside [0, {per_epoch + 1}]")
    return last_epoch_samples < int(LAST_EPOCH_FRACTION * per_epoch)


def build_doc_idx(documents: np.ndarray | range, num_epochs: int, rng: np.random.Generator) -> np.ndarray:
    """[num_epochs * len(documents)] int32: one independent random order of `documents` per epoch."""
    n = len(documents)
    if n and max(documents[0], documents[-1]) > np.iinfo(np.int32).max:
        raise ValueError("document ids must fit in int32")
    if isinstance(documents, range):
        first = documents.start

        def source(a: int, b: int) -> np.ndarray:
            return np.arange(first + a, first + b, dtype=np.int32)
    else:
        documents = np.asarray(documents)

        def source(a: int, b: int) -> np.ndarray:
            return documents[a:b]

    doc_idx = np.empty(num_epochs * n, dtype=np.int32)
    for epoch in range(num_epochs):
        # In place: a temporary per epoch would double the 1.4 GB peak at BLOOM scale.
        shuffled_values(n, source, np.int32, rng, out=doc_idx[epoch * n : (epoch + 1) * n])
    return doc_idx


def sample_idx_dtype(doc_idx_len: int, max_doc_size: int) -> np.dtype:
    """int32 like Megatron while positions fit (they always do below 2^31 documents), else int64."""
    if doc_idx_len < np.iinfo(np.int32).max and max_doc_size < np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def iter_sample_idx_chunks(
    sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_samples: int, doc_chunk: int = DOC_CHUNK
) -> Iterator[np.ndarray]:
    """Yields consecutive row blocks of sample_idx [num_samples + 1, 2], in order.

    Row k is boundary k at stream position q = k*seq_length: (j, q - start of doc_idx[j]) where j
    is the first position in doc_idx whose cumulative end exceeds q (Megatron's values, tested
    against its loop and its C++ helper).
    """
    dtype = sample_idx_dtype(len(doc_idx), int(sizes.max()) if len(sizes) else 0)
    next_row = 0  # first boundary not yet emitted
    tokens_before = 0  # tokens of doc_idx[:chunk_start]
    for chunk_start in range(0, len(doc_idx), doc_chunk):
        if next_row > num_samples:
            break
        chunk = doc_idx[chunk_start : chunk_start + doc_chunk]
        # bounds[j] = stream position where chunk document j starts; bounds[j+1] where it ends.
        bounds = np.empty(len(chunk) + 1, dtype=np.int64)
        bounds[0] = tokens_before
        bounds[1:] = sizes[chunk]
        np.cumsum(bounds, out=bounds)  # in place, int64 to int64: 2x faster than cumsum(dtype=)
        chunk_end_position = int(bounds[-1])
        # Boundary k (at k*seq) lies in document j iff bounds[j] <= k*seq < bounds[j+1], i.e.
        # ceil(bounds[j]/seq) <= k < ceil(bounds[j+1]/seq): count them per document and repeat j
        # that many times. Sequential passes only (a searchsorted is ~3x slower: cache misses).
        first_boundary = -(-bounds // seq_length)  # ceil, int64 [len(chunk) + 1]
        per_document = np.diff(first_boundary)
        rows_here = min(int(first_boundary[-1]), num_samples + 1) - next_row
        if rows_here > 0:
            local = np.repeat(np.arange(len(chunk), dtype=np.int32), per_document)[:rows_here]
            positions = np.arange(next_row, next_row + rows_here, dtype=np.int64) * seq_length
            rows = np.empty((rows_here, 2), dtype=dtype)
            rows[:, 0] = local
            rows[:, 0] += chunk_start
            rows[:, 1] = positions - bounds[local]
            if next_row == 0:
                rows[0] = (0, 0)  # Megatron's first row, even if the first document is empty
            yield rows
            next_row += rows_here
        tokens_before = chunk_end_position
    if next_row <= num_samples:
        raise ValueError(
            f"doc_idx holds {tokens_before} tokens: not enough for {num_samples} samples of {seq_length}"
        )


def build_sample_idx(sizes: np.ndarray, doc_idx: np.ndarray, seq_length: int, num_samples: int,
                     doc_chunk: int = DOC_CHUNK) -> np.ndarray:
    """[num_samples + 1, 2] in memory (the cache streams the chunks to disk instead)."""
    return np.concatenate(list(iter_sample_idx_chunks(sizes, doc_idx, seq_length, num_samples, doc_chunk)))


def shuffle_idx_dtype(total: int) -> np.dtype:
    return np.dtype(np.uint32) if total < np.iinfo(np.uint32).max - 1 else np.dtype(np.int64)


def build_shuffle_idx(num_first: int, total: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation of [0, num_first) followed by a permutation of [num_first, total)."""
    dtype = shuffle_idx_dtype(total)
    out = np.empty(total, dtype=dtype)
    for start, stop in ((0, num_first), (num_first, total)):
        if stop > start:
            shuffled_values(stop - start, lambda a, b, s=start: np.arange(s + a, s + b, dtype=dtype), dtype, rng,
                            out=out[start:stop])
    return out
