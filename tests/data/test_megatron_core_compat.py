"""Cross-checks against Megatron-LM itself (the `megatron-core` package), when it is installed.

megatron-core is not a dependency of the toolkit; install it to run these
(`pip install --no-deps megatron-core==0.16.1`: its dataset modules need only torch and numpy,
and the wheel ships the compiled C++ helpers). Without it the module is skipped; the byte-level
format tests in test_indexed_format.py and the loop references in test_sample_index.py cover
the same ground from Megatron's specification.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    megatron_indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    megatron_helpers = pytest.importorskip("megatron.core.datasets.helpers")

import torch  # noqa: E402

from trainer.data import sample_index as si  # noqa: E402
from trainer.data.blending import build_blending_indices  # noqa: E402
from trainer.data.indexed_dataset import MMapIndexedDataset  # noqa: E402

# Importing megatron.core takes ~20 s (it imports its whole model stack).
pytestmark = pytest.mark.slow


def test_megatron_reads_our_files(corpus_prefix: str) -> None:
    ours = MMapIndexedDataset(corpus_prefix)
    theirs = megatron_indexed.IndexedDataset(corpus_prefix)
    assert len(theirs) == len(ours)
    np.testing.assert_array_equal(theirs.sequence_lengths, ours.sizes)
    np.testing.assert_array_equal(theirs.document_indices, ours.doc_idx)
    for i in range(0, len(ours), 37):
        np.testing.assert_array_equal(theirs[i], ours[i])
    print(f"Megatron read {len(theirs)} sequences of our corpus identically")


def test_we_read_megatron_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    documents = [[rng.integers(0, 250_000, size=int(rng.integers(1, 50))) for _ in range(int(rng.integers(1, 4)))]
                 for _ in range(40)]  # several sentences per document, int32 tokens
    builder = megatron_indexed.IndexedDatasetBuilder(str(tmp_path / "meg.bin"), dtype=np.int32)
    for document in documents:
        for sentence in document:
            builder.add_item(torch.from_numpy(sentence.astype(np.int32)))
        builder.end_document()
    builder.finalize(str(tmp_path / "meg.idx"))
    ours = MMapIndexedDataset(tmp_path / "meg")
    sentences = [s for d in documents for s in d]
    assert ours.dtype == np.int32 and len(ours) == len(sentences)
    for i, sentence in enumerate(sentences):
        np.testing.assert_array_equal(ours[i], sentence)
    np.testing.assert_array_equal(ours.doc_idx, np.cumsum([0] + [len(d) for d in documents]))


@pytest.mark.parametrize("seed", range(4))
def test_sample_idx_equals_megatrons_cpp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    seq = int(rng.integers(8, 200))
    sizes = rng.integers(1, 4 * seq, size=int(rng.integers(50, 2000))).astype(np.int32)
    documents = np.arange(len(sizes), dtype=np.int32)
    tokens = si.num_tokens(documents, sizes)
    epochs = int(rng.integers(1, 4))
    doc_idx = si.build_doc_idx(documents, epochs, rng)
    theirs = megatron_helpers.build_sample_idx(sizes, doc_idx, seq, epochs, tokens, True, True)
    ours = si.build_sample_idx(sizes, doc_idx, seq, si.samples_in(epochs, tokens, seq), doc_chunk=101)
    print(f"seed={seed}: {len(ours) - 1} samples, max |diff| vs Megatron C++ = "
          f"{int(np.abs(theirs.astype(np.int64) - ours).max())}")
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("num_datasets", [2, 3, 7])
def test_blending_equals_megatrons_cpp(num_datasets: int) -> None:
    weights = np.random.default_rng(num_datasets).random(num_datasets)
    weights = weights / weights.sum()
    size = 5000
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    megatron_helpers.build_blending_indices(dataset_index, dataset_sample_index, weights.astype(np.float64),
                                            num_datasets, size, False)
    ours_index, ours_sample = build_blending_indices(list(weights), size)
    np.testing.assert_array_equal(ours_index, dataset_index)
    np.testing.assert_array_equal(ours_sample, dataset_sample_index)
