"""Megatron-style data pipeline: indexed token files, cached sample indices, blending, resumable loader.

    train_ds, valid_ds, test_ds = build_train_valid_test_datasets(
        data_prefixes, weights, split="949,50,1", num_samples=(train, valid, test),
        seq_length=2048, seed=1234, cache_dir=run_paths.data_cache, build_on_this_rank=rank == 0)
    loader = build_data_loader(train_ds, consumed_samples, micro_batch_size, dp_rank, dp_size, skips=skips)

Rank 0 calls with build_on_this_rank=True, then a barrier, then every other rank with False (they
only memory-map the cache). Each dataset item is {"text": int64 [seq_length + 1]}; each loader
batch is {"text": LongTensor [micro_batch_size, seq_length + 1]}. See docs/data.md.
"""

from __future__ import annotations

from pathlib import Path

from trainer.data.blending import BlendedDataset, normalize_weights, per_dataset_num_samples
from trainer.data.gpt_dataset import GPTDataset, build_split_datasets
from trainer.data.index_cache import IndexCacheMissing
from trainer.data.indexed_dataset import MMapIndexedDataset
from trainer.data.sampler import MegatronPretrainingSampler
from orchestrator.contract.client.skips import SampleSkips

__all__ = [
    "BlendedDataset", "GPTDataset", "IndexCacheMissing", "MMapIndexedDataset", "MegatronPretrainingSampler", "SampleSkips",
    "build_data_loader", "build_train_valid_test_datasets", "train_valid_test_num_samples",
]

_SPLIT_NAMES = ("train", "valid", "test")


def build_train_valid_test_datasets(
    data_prefixes: list[str],
    weights: list[float],
    split: str,
    num_samples: tuple[int, int, int],
    seq_length: int,
    seed: int,
    cache_dir: Path,
    build_on_this_rank: bool,
) -> tuple:
    """(train, valid, test): a GPTDataset for one prefix, a BlendedDataset of several; None for a
    split without documents or without samples asked. Raises IndexCacheMissing when
    build_on_this_rank is False and the indices are not cached yet."""
    if len(data_prefixes) == 0:
        raise ValueError("no datasets given (data.datasets is empty)")
    if len(weights) != len(data_prefixes):
        raise ValueError(f"{len(data_prefixes)} dataset prefixes but {len(weights)} weights")
    num_samples = tuple(int(n) for n in num_samples)
    if len(num_samples) != 3 or any(n < 0 for n in num_samples):
        raise ValueError(f"num_samples must be three counts >= 0 (train, valid, test), got {num_samples}")
    cache_dir = Path(cache_dir)
    if len(data_prefixes) == 1:
        normalize_weights(weights)
        return tuple(build_split_datasets(str(data_prefixes[0]), split, num_samples, seq_length, seed,
                                          cache_dir, build_on_this_rank))
    # Each dataset is split into train/valid/test on its own, then the splits are blended.
    per_dataset = per_dataset_num_samples(weights, num_samples)
    splits_of_each = [
        build_split_datasets(str(prefix), split, counts, seq_length, seed, cache_dir, build_on_this_rank)
        for prefix, counts in zip(data_prefixes, per_dataset, strict=True)
    ]
    blends = []
    for index, name in enumerate(_SPLIT_NAMES):
        members = [(splits[index], w) for splits, w in zip(splits_of_each, weights, strict=True) if splits[index] is not None]
        if num_samples[index] == 0 or not members:
            blends.append(None)
            continue
        datasets, member_weights = zip(*members, strict=True)
        blends.append(BlendedDataset(list(datasets), list(member_weights), num_samples[index], name, seed,
                                     cache_dir, build_on_this_rank))
    return tuple(blends)


def train_valid_test_num_samples(train_samples: int | None, train_tokens: int | None, seq_length: int,
                                 global_batch_size: int, eval_interval: int, eval_iters: int) -> tuple[int, int, int]:
    """Samples to ask of each split, as Megatron: valid covers every evaluation of the run
    ((train_iters // eval_interval + 1) * eval_iters batches), test one evaluation. Give exactly
    one of train_samples / train_tokens (config `data.train_samples|train_tokens`); tokens are
    rounded up to whole samples of seq_length."""
    if (train_samples is None) == (train_tokens is None):
        raise ValueError("give exactly one of train_samples or train_tokens")
    if train_samples is None:
        train_samples = -(-int(train_tokens) // seq_length)
    train_iters = -(-int(train_samples) // global_batch_size)
    valid = (train_iters // eval_interval + 1) * eval_iters * global_batch_size
    return int(train_samples), int(valid), int(eval_iters * global_batch_size)


def build_data_loader(dataset, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                      num_workers: int = 0, skips: SampleSkips | None = None):
    """A torch DataLoader of this DP rank's micro-batches, starting after `consumed_samples` (a
    data position), never serving a position of `skips`."""
    import torch

    if dataset is None:
        return None
    sampler = MegatronPretrainingSampler(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size,
                                         skips=skips)
    # The loader's own generator: without one, every new iterator draws its base seed from the
    # GLOBAL torch RNG, the one dropout uses. A resumed run creates its iterator right after the
    # checkpoint's RNG state is restored, so that extra draw shifted every dropout mask after a
    # resume, and each evaluation's loader shifted them again (the order comes from the sampler; the
    # base seed only seeds worker processes, which do nothing random here).
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=_collate,
        persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(consumed_samples),
    )


def _collate(items: list[dict]) -> dict:
    import numpy as np
    import torch

    return {"text": torch.from_numpy(np.stack([item["text"] for item in items]))}
