"""Fixtures of the data-pipeline tests: small indexed datasets written with real files."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from trainer.data.indexed_dataset import IndexedDatasetBuilder  # noqa: E402


def write_random_dataset(prefix: Path, num_docs: int, seed: int, mean_size: float = 60.0,
                         vocab: int = 4096, dtype=np.uint16) -> list[np.ndarray]:
    """Documents of lognormal sizes (>= 1 token) with random tokens; returns them."""
    rng = np.random.default_rng(seed)
    sizes = np.maximum(1, rng.lognormal(np.log(mean_size), 0.8, size=num_docs).astype(np.int64))
    docs = [rng.integers(0, vocab, size=int(s), dtype=np.int64) for s in sizes]
    builder = IndexedDatasetBuilder(prefix, dtype)
    for doc in docs:
        builder.add_document(doc)
    builder.finalize()
    return docs


@pytest.fixture
def random_dataset(tmp_path: Path) -> Callable[..., tuple[str, list[np.ndarray]]]:
    def make(num_docs: int = 300, seed: int = 0, name: str = "ds", **kwargs) -> tuple[str, list[np.ndarray]]:
        prefix = tmp_path / name
        return str(prefix), write_random_dataset(prefix, num_docs, seed, **kwargs)

    return make


@pytest.fixture(scope="session")
def corpus_prefix(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shipped multilingual corpus, tokenised into a temp dir once per session (~2 s)."""
    from trainer.data.prepare_corpus import prepare_corpus

    return prepare_corpus(tmp_path_factory.mktemp("corpus"))["prefix"]
