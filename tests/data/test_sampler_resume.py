"""Exact resume from consumed_samples, including a global batch size that ramps up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.data import MegatronPretrainingSampler, build_data_loader, build_train_valid_test_datasets

MBS, DP = 2, 3
# Global batch size per step during a rampup: multiples of MBS*DP = 6.
GBS_SCHEDULE = [6, 6, 12, 12, 18, 24, 24, 24, 24, 24]


def run_steps(total: int, schedule: list[int], consumed: int = 0) -> tuple[list[list[list[int]]], int]:
    """Simulates the trainer: per step, every DP rank draws gbs/(mbs*dp) micro-batches from its own
    sampler, and consumed_samples advances by the global batch. Returns the samples of every step
    and rank, and the final consumed_samples. The samplers are created once, at `consumed`."""
    iterators = [iter(MegatronPretrainingSampler(total, consumed, MBS, rank, DP)) for rank in range(DP)]
    steps = []
    for gbs in schedule:
        accumulation = gbs // (MBS * DP)
        per_rank = [[i for _ in range(accumulation) for i in next(it)] for it in iterators]
        steps.append(per_rank)
        consumed += gbs
    return steps, consumed


@pytest.mark.parametrize("stop_after", [1, 2, 3, 5, 8])
def test_resume_continues_the_stream_exactly(stop_after: int) -> None:
    total = 1000
    reference, _ = run_steps(total, GBS_SCHEDULE)
    first, consumed = run_steps(total, GBS_SCHEDULE[:stop_after])
    # "Restart": new samplers built from the checkpointed consumed_samples only.
    rest, _ = run_steps(total, GBS_SCHEDULE[stop_after:], consumed=consumed)
    assert first + rest == reference
    flat = [i for step in reference for rank in step for i in rank]
    assert sorted(flat) == list(range(sum(GBS_SCHEDULE)))  # every sample once, none skipped
    print(f"stopped after {stop_after} steps at consumed_samples={consumed}: resumed stream identical")


def test_ranks_split_each_micro_step() -> None:
    batches = [list(MegatronPretrainingSampler(20, 6, MBS, rank, DP)) for rank in range(DP)]
    assert batches[0][:2] == [[6, 7], [12, 13]]
    assert batches[1][:2] == [[8, 9], [14, 15]]
    assert batches[2][:2] == [[10, 11], [16, 17]]
    assert all(len(b) == 2 for b in batches)  # 14 samples left: 2 full micro-steps, the rest dropped
    assert len(MegatronPretrainingSampler(20, 6, MBS, 0, DP)) == 2


def test_bad_consumed_samples_are_explained() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        MegatronPretrainingSampler(100, 7, MBS, 0, DP)
    with pytest.raises(ValueError, match="outside the dataset"):
        MegatronPretrainingSampler(100, 120, MBS, 0, DP)
    with pytest.raises(ValueError, match="dp_rank"):
        MegatronPretrainingSampler(100, 0, MBS, 3, DP)


def test_loader_resumes_with_real_tensors(corpus_prefix: str, tmp_path: Path) -> None:
    train, _, _ = build_train_valid_test_datasets(
        [corpus_prefix], [1.0], split="98,1,1", num_samples=(200, 0, 0), seq_length=64, seed=1,
        cache_dir=tmp_path / "data_cache", build_on_this_rank=True)
    consumed = 0
    seen: dict[int, list[torch.Tensor]] = {rank: [] for rank in range(DP)}
    loaders = [iter(build_data_loader(train, consumed, MBS, rank, DP)) for rank in range(DP)]
    for gbs in (6, 12):
        for _ in range(gbs // (MBS * DP)):
            for rank in range(DP):
                seen[rank].append(next(loaders[rank])["text"])
        consumed += gbs
    resumed = [next(iter(build_data_loader(train, consumed, MBS, rank, DP)))["text"] for rank in range(DP)]
    for rank in range(DP):
        batch = resumed[rank]
        assert batch.dtype == torch.int64 and tuple(batch.shape) == (MBS, 65)
        start = consumed + rank * MBS
        expected = np.stack([train[i]["text"] for i in range(start, start + MBS)])
        np.testing.assert_array_equal(batch.numpy(), expected)
        # And it is the batch the uninterrupted loader would have produced next.
        np.testing.assert_array_equal(next(loaders[rank])["text"].numpy(), expected)
    assert int(seen[0][0][0, 0]) == int(train[0]["text"][0])
