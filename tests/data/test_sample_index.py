"""The vectorised index arrays against plain-loop implementations, and the samples they give."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from trainer.data import sample_index as si
from trainer.data.gpt_dataset import GPTDataset
from trainer.data.indexed_dataset import MMapIndexedDataset
from trainer.data.shuffle import shuffled_arange, shuffled_values


def loop_num_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Megatron's `_num_epochs`, as a loop."""
    epochs, total = 0, 0
    while True:
        epochs += 1
        total += tokens_per_epoch
        if (total - 1) // seq_length >= num_samples:
            return epochs


def loop_sample_idx(sizes, doc_idx, seq_length: int, num_samples: int) -> np.ndarray:
    """Megatron's `_build_sample_idx` (the reference of its C++ helper), in pure Python."""
    out = [[0, 0]]
    doc_index, doc_offset = 0, 0
    while len(out) <= num_samples:
        remaining = seq_length + 1
        while remaining != 0:
            doc_length = int(sizes[doc_idx[doc_index]]) - doc_offset
            remaining -= doc_length
            if remaining <= 0:
                doc_offset += remaining + doc_length - 1
                remaining = 0
            else:
                doc_index += 1
                doc_offset = 0
        out.append([doc_index, doc_offset])
    return np.asarray(out, dtype=np.int64)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("seq_length", [1, 7, 64])
def test_sample_idx_equals_the_loop(seed: int, seq_length: int) -> None:
    rng = np.random.default_rng(seed)
    num_docs = int(rng.integers(1, 200))
    sizes = rng.integers(1, 3 * seq_length + 5, size=num_docs).astype(np.int32)
    if seed % 2:  # empty documents are legal in Megatron files (sentence-split datasets)
        sizes[rng.integers(0, num_docs, size=num_docs // 5)] = 0
        sizes[0] = max(sizes[0], 1)
    documents = np.arange(num_docs, dtype=np.int32)
    tokens = si.num_tokens(documents, sizes)
    wanted = int(rng.integers(1, 4 * max(1, tokens // seq_length) + 2))  # several epochs
    epochs = si.num_epochs_needed(tokens, seq_length, wanted)
    assert epochs == loop_num_epochs(tokens, seq_length, wanted)
    total = si.samples_in(epochs, tokens, seq_length)
    doc_idx = si.build_doc_idx(documents, epochs, np.random.default_rng(seed))
    expected = loop_sample_idx(sizes, doc_idx, seq_length, total)
    for doc_chunk in (1, 7, si.DOC_CHUNK):  # chunk boundaries must not matter
        got = si.build_sample_idx(sizes, doc_idx, seq_length, total, doc_chunk=doc_chunk)
        assert got.dtype == np.int32
        max_diff = int(np.abs(got.astype(np.int64) - expected).max())
        print(f"seed={seed} seq={seq_length} docs={num_docs} epochs={epochs} samples={total} "
              f"chunk={doc_chunk}: max |diff| = {max_diff}")
        np.testing.assert_array_equal(got, expected)


def test_doc_idx_is_one_permutation_per_epoch() -> None:
    documents = np.arange(10, 60, dtype=np.int32)
    doc_idx = si.build_doc_idx(documents, 3, np.random.default_rng(7))
    epochs = doc_idx.reshape(3, -1)
    for epoch in epochs:
        np.testing.assert_array_equal(np.sort(epoch), documents)
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[0], documents)
    np.testing.assert_array_equal(doc_idx, si.build_doc_idx(documents, 3, np.random.default_rng(7)))
    assert not np.array_equal(doc_idx, si.build_doc_idx(documents, 3, np.random.default_rng(8)))


def test_separate_last_epoch_rule_and_shuffle_split() -> None:
    tokens, seq = 1001, 10  # 100 samples per epoch
    # 2.3 epochs -> last epoch has 30 samples < 80 -> separate; 2.9 epochs -> 90 >= 80 -> together.
    assert si.use_separate_last_epoch(si.num_epochs_needed(tokens, seq, 230), tokens, seq, 230) is True
    assert si.use_separate_last_epoch(si.num_epochs_needed(tokens, seq, 290), tokens, seq, 290) is False
    assert si.use_separate_last_epoch(1, tokens, seq, 50) is False
    num_first, total = si.samples_in(2, tokens, seq), si.samples_in(3, tokens, seq)
    shuffle = si.build_shuffle_idx(num_first, total, np.random.default_rng(0))
    assert shuffle.dtype == np.uint32 and len(shuffle) == total
    np.testing.assert_array_equal(np.sort(shuffle[:num_first]), np.arange(num_first))
    np.testing.assert_array_equal(np.sort(shuffle[num_first:]), np.arange(num_first, total))


def test_shuffle_is_uniform() -> None:
    """Chi-square over all 24 permutations of 4 elements, with chunks smaller than the input so
    that the chunked fill from `source` is exercised."""
    rng = np.random.default_rng(123)
    draws = 12_000
    counts: dict[tuple[int, ...], int] = {p: 0 for p in itertools.permutations(range(4))}
    for _ in range(draws):
        perm = shuffled_values(4, lambda a, b: np.arange(a, b), np.int64, rng, chunk_elements=3)
        counts[tuple(int(x) for x in perm)] += 1
    expected = draws / 24
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    print(f"chi2 = {chi2:.1f} over 23 degrees of freedom (p=0.001 critical: 49.7)")
    assert chi2 < 49.7


def test_shuffled_range_is_a_permutation() -> None:
    perm = shuffled_arange(5, 300_005, np.int32, np.random.default_rng(1))
    np.testing.assert_array_equal(np.sort(perm), np.arange(5, 300_005))
    assert np.mean(np.diff(perm.astype(np.int64)) == 1) < 0.01  # no runs of the input order survive
    documents = range(10, 20)
    np.testing.assert_array_equal(np.sort(si.build_doc_idx(documents, 2, np.random.default_rng(0))),
                                  np.repeat(np.arange(10, 20), 2))


@pytest.mark.parametrize("num_samples", [40, 250])  # one epoch; several with a short last one
def test_dataset_samples_are_slices_of_the_epoch_stream(random_dataset, tmp_path: Path, num_samples: int) -> None:
    prefix, docs = random_dataset(num_docs=80, seed=5, mean_size=30)
    indexed = MMapIndexedDataset(prefix)
    seq = 32
    documents = np.arange(len(docs), dtype=np.int32)
    ds = GPTDataset("train", indexed, documents, num_samples, seq, 99, tmp_path / "cache", True)
    tokens = sum(len(d) for d in docs)
    epochs = loop_num_epochs(tokens, seq, num_samples)
    assert len(ds) == (epochs * tokens - 1) // seq >= num_samples
    stream = np.concatenate([docs[int(d)] for d in ds.doc_idx])
    seen = set()
    for i in range(len(ds)):
        s = int(ds.shuffle_idx[i])
        seen.add(s)
        item = ds[i]["text"]
        assert item.dtype == np.int64 and item.shape == (seq + 1,)
        np.testing.assert_array_equal(item, stream[s * seq : s * seq + seq + 1])
    assert seen == set(range(len(ds)))
    print(f"num_samples={num_samples}: {len(ds)} samples over {epochs} epochs all equal the stream slices")
    if epochs > 1 and si.use_separate_last_epoch(epochs, tokens, seq, num_samples):
        first = si.samples_in(epochs - 1, tokens, seq)
        assert math.isclose(float(np.max(ds.shuffle_idx[:first])), first - 1)
