"""A copy of an indexed corpus in which the training samples at some positions of a run's global
sample order hold random token ids: a loss spike caused by data, of a realistic size.

Only the tokens inside each sample are replaced (not its first and last token, which it shares
with the samples before and after it in the corpus): no other sample changes. The lengths are
unchanged, so the index files (documents, samples, shuffle) built from the copy are the same as
from the original, and so is the sample order.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.data import build_train_valid_test_datasets
from trainer.data.indexed_dataset import MMapIndexedDataset, data_path, index_path


@dataclass(frozen=True)
class PoisonedCorpus:
    prefix: Path
    positions: range  # of the global sample order
    tokens_replaced: int


def _token_spans(dataset, position: int) -> list[tuple[int, int, int]]:
    """(document id, first token, end token) of the corpus spans sample `position` reads."""
    if hasattr(dataset, "dataset_index"):  # a blend of several corpora: the one member that holds it
        dataset, position = dataset.datasets[int(dataset.dataset_index[position])], int(dataset.dataset_sample_index[position])
    sample = int(dataset.shuffle_idx[position])
    (doc_first, offset_first), (doc_last, offset_last) = (tuple(int(x) for x in dataset.sample_idx[s]) for s in (sample, sample + 1))
    spans = []
    for d in range(doc_first, doc_last + 1):
        doc = int(dataset.doc_idx[d])
        start = offset_first if d == doc_first else 0
        end = offset_last + 1 if d == doc_last else int(dataset.indexed.sizes[doc])
        spans.append((doc, start, end))
    return spans


def poison_corpus(source: Path, target: Path, cfg, positions: range, seed: int = 0) -> PoisonedCorpus:
    """Copy corpus `source` (a prefix) to `target` with the samples at `positions` of the training
    order of `cfg` (its split, sample count, sequence length and data seed) made of random ids."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for path in (index_path(source), data_path(source)):
        shutil.copyfile(path, Path(f"{target}{path.suffix}"))
    with tempfile.TemporaryDirectory(prefix="poison-cache-") as cache:
        train = build_train_valid_test_datasets(
            [str(source)], [1.0], cfg.data.split, (cfg.train_samples, 0, 0), cfg.model.seq_length, cfg.data.seed,
            Path(cache), True,
        )[0]
        samples = [_token_spans(train, position) for position in positions]
    original = MMapIndexedDataset(source)
    tokens = np.memmap(data_path(target), mode="r+", dtype=original.dtype)
    rng = np.random.default_rng(seed)
    replaced = 0
    for spans in samples:
        for number, (doc, start, end) in enumerate(spans):
            first_token = int(original.pointers[doc]) // original.dtype.itemsize
            # Inside the sample only: its first and last token belong to the samples beside it too.
            lo = first_token + start + (1 if number == 0 else 0)
            hi = first_token + end - (1 if number == len(spans) - 1 else 0)
            if hi > lo:
                ids = rng.integers(4, cfg.model.vocab_size, size=hi - lo)
                tokens[lo:hi] = ids.astype(original.dtype)
                replaced += hi - lo
    tokens.flush()
    del tokens
    return PoisonedCorpus(Path(target), positions, replaced)
