"""Weighted blending of several datasets, with Megatron's greedy algorithm, cached on disk.

Megatron's `build_blending_indices`: for output sample i, pick the dataset whose count is furthest
below its ideal share, weight_d * max(i, 1) (ties to the lowest index). Then at every prefix of
the output each dataset's count is within one sample of weight_d * prefix length, so a run
stopped at any step has seen the datasets in the right proportions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from trainer.data.index_cache import CacheEntry, cache_entry, dataset_fingerprint, load_or_build, save_array

BLEND_NAMES = ("dataset_index", "dataset_sample_index")
OVERSAMPLE = 1.005  # Megatron asks each dataset for 0.5% more samples than its share, for rounding


def normalize_weights(weights: list[float]) -> list[float]:
    if not weights or any((not math.isfinite(w)) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"dataset weights {weights} must be finite, >= 0 and not all zero")
    total = float(sum(weights))
    return [w / total for w in weights]


def per_dataset_num_samples(weights: list[float], num_samples: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """Samples to ask of each dataset for its share of each split: ceil(n * w * 1.005)."""
    return [tuple(int(math.ceil(n * w * OVERSAMPLE)) for n in num_samples) for w in normalize_weights(weights)]


def build_blending_indices(weights: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset_index [size] uint8/int16, dataset_sample_index [size] int64), Megatron's greedy.

    A plain loop (Megatron runs it in C++): 75-155 ns of CPU per sample and dataset here (BLOOM's
    46 datasets x 171M samples: ~10 min), so it is built once and cached with the other indices.
    """
    weights = normalize_weights(weights)
    num_datasets = len(weights)
    dataset_index = np.empty(size, dtype=np.uint8 if num_datasets < 256 else np.int16)
    dataset_sample_index = np.empty(size, dtype=np.int64)
    counts = [0] * num_datasets
    chosen_list = [0] * size
    taken_list = [0] * size
    pairs = list(enumerate(weights))
    for i in range(size):
        scale = i if i > 1 else 1.0
        best, best_error = 0, weights[0] * scale - counts[0]
        for d, weight in pairs:
            error = weight * scale - counts[d]
            if error > best_error:
                best, best_error = d, error
        chosen_list[i] = best
        taken_list[i] = counts[best]
        counts[best] += 1
    dataset_index[:] = chosen_list
    dataset_sample_index[:] = taken_list
    return dataset_index, dataset_sample_index


class BlendedDataset:
    """Sample i is sample dataset_sample_index[i] of dataset dataset_index[i]."""

    def __init__(self, datasets: list, weights: list[float], size: int, name: str, seed: int,
                 cache_dir: Path, build_on_this_rank: bool) -> None:
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        self.datasets, self.weights, self.size = datasets, normalize_weights(weights), int(size)
        params = {
            "datasets": [dict(dataset_fingerprint(d.indexed.prefix), **d.cache_entry.params) for d in datasets],
            "weights": self.weights, "size": self.size, "split": name, "seed": int(seed),
        }
        entry = cache_entry(cache_dir, f"blend_{len(datasets)}ds_{name}", params, f"{self.size}ns")
        arrays, self.index_built = load_or_build(entry, BLEND_NAMES, self._build, build_on_this_rank)
        self.dataset_index, self.dataset_sample_index = arrays["dataset_index"], arrays["dataset_sample_index"]
        # dataset_sample_index counts up per dataset, so dataset d needs bincount[d] samples.
        needed = np.bincount(self.dataset_index, minlength=len(datasets))
        for d, dataset in enumerate(datasets):
            if needed[d] > len(dataset):
                raise ValueError(f"the blend needs {needed[d]} samples of dataset {d}, which has {len(dataset)}")

    def _build(self, entry: CacheEntry) -> dict[str, tuple[int, ...]]:
        dataset_index, dataset_sample_index = build_blending_indices(self.weights, self.size)
        save_array(entry.array_path("dataset_index"), dataset_index)
        save_array(entry.array_path("dataset_sample_index"), dataset_sample_index)
        return {"dataset_index": dataset_index.shape, "dataset_sample_index": dataset_sample_index.shape}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int) -> dict[str, np.ndarray]:
        if not -self.size <= idx < self.size:
            raise IndexError(f"sample {idx} out of range for a blend of {self.size} samples")
        return self.datasets[int(self.dataset_index[idx])][int(self.dataset_sample_index[idx])]
