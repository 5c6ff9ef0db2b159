"""The exact data skip of a rollback: the loader serves the index order minus the skipped ranges,
everything else in its original order, across global batches, DP ranks and a resume.

The oracle is the data index itself: `dataset[p]` for p = 0, 1, 2, ... is the order without skips
(no sampler involved); the expected stream is that order with the positions of the ranges left
out, written here as a set of positions, not through SampleSkips.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from trainer.data import build_data_loader, build_train_valid_test_datasets
from orchestrator.contract.client.skips import SampleSkips

MBS, DP = 2, 2
# Global batch per step: a rampup 4 -> 8, as the trainer's schedule would give (multiples of MBS*DP).
SCHEDULE = [4, 4, 8, 8, 8, 8, 8, 8, 8, 8]
# [6, 19) spans the step boundaries at positions 8 and 16 of the unskipped order and starts and ends
# inside a micro-step; [30, 33) is odd-sized; [41, 42) a single sample.
RANGES = [(6, 19), (30, 33), (41, 42)]


def kept_oracle(ranges, limit: int) -> list[int]:
    skipped = {p for start, end in ranges for p in range(start, end)}
    return [p for p in range(limit) if p not in skipped]


def run_steps(train, skips: SampleSkips, consumed: int, schedule: list[int]):
    """As the trainer does: one loader per DP rank created at `consumed`; per step each rank draws
    gbs/(MBS*DP) micro-batches, in micro-step order. Returns (texts in global order, consumed after
    each step)."""
    loaders = [iter(build_data_loader(train, consumed, MBS, rank, DP, skips=skips)) for rank in range(DP)]
    texts, after = [], []
    for gbs in schedule:
        for _ in range(gbs // (MBS * DP)):
            for rank in range(DP):  # micro-step: rank 0's MBS samples, then rank 1's
                texts.extend(loaders[rank].__next__()["text"].numpy())
        consumed = skips.advance(consumed, gbs)
        after.append(consumed)
    return texts, after


@pytest.fixture(scope="module")
def train(corpus_prefix: str, tmp_path_factory: pytest.TempPathFactory):
    train, _, _ = build_train_valid_test_datasets(
        [corpus_prefix], [1.0], split="98,1,1", num_samples=(200, 0, 0), seq_length=32, seed=3,
        cache_dir=tmp_path_factory.mktemp("data_cache"), build_on_this_rank=True)
    return train


def test_skipped_ranges_never_served_everything_else_in_order_across_a_resume(train) -> None:
    skips = SampleSkips(RANGES)
    stop = 5  # "checkpoint" after step 5, which is after every range: the resume must keep skipping
    first, after_first = run_steps(train, skips, 0, SCHEDULE[:stop])
    rest, after_rest = run_steps(train, skips, after_first[-1], SCHEDULE[stop:])
    served = first + rest

    kept = kept_oracle(RANGES, len(train))
    total = sum(SCHEDULE)
    expected = [train[p]["text"] for p in kept[:total]]
    assert len(served) == total
    for i, (got, want) in enumerate(zip(served, expected, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"sample {i} of the stream (position {kept[i]})")
    # consumed_samples is the data position: one past the last position served, skipped ones included.
    taken = np.cumsum(SCHEDULE)
    assert after_first + after_rest == [kept[n - 1] + 1 for n in taken]
    assert after_first[-1] > RANGES[-1][1]  # the resume point really is after the skips
    print("consumed after each step:", after_first + after_rest, "(without skips:", list(taken), ")")


def test_resume_inside_and_at_the_edge_of_a_range(train) -> None:
    """A checkpoint's position may sit right before a range (a rollback's) or anywhere after one:
    the resumed stream is the remainder of the same kept stream."""
    skips = SampleSkips(RANGES)
    kept = kept_oracle(RANGES, len(train))
    whole, _ = run_steps(train, skips, 0, SCHEDULE)
    for stop in (1, 2, 3):
        head, after = run_steps(train, skips, 0, SCHEDULE[:stop])
        tail, _ = run_steps(train, skips, after[-1], SCHEDULE[stop:])
        assert all(np.array_equal(a, b) for a, b in zip(head + tail, whole, strict=True)), stop
    # A rollback: the checkpoint at position 4 (after step 1, no skips yet), skip [4, 20).
    rollback = SampleSkips([(4, 20)])
    served, after = run_steps(train, rollback, 4, [4, 8])
    expected = [train[p]["text"] for p in [20, 21, 22, 23] + list(range(24, 32))]
    assert all(np.array_equal(a, b) for a, b in zip(served, expected, strict=True))
    assert after == [24, 32] and kept[:3] == [0, 1, 2]


def test_skips_maps_against_a_set_of_positions() -> None:
    rng = random.Random(7)
    for _ in range(300):
        limit = rng.randint(1, 80)
        ranges = []
        for _ in range(rng.randint(0, 5)):
            start = rng.randint(0, limit - 1)
            ranges.append((start, rng.randint(start + 1, limit + 5)))
        skips = SampleSkips(ranges)
        kept = kept_oracle(ranges, limit + 100)
        for k in range(limit):
            assert skips.position_of(k) == kept[k], (ranges, k)
        for position in range(limit + 6):
            assert skips.kept_below(position) == sum(1 for p in kept if p < position), (ranges, position)
            assert skips.from_position(position).kept_below(limit + 10) - skips.from_position(position).kept_below(
                position) == sum(1 for p in kept if position <= p < limit + 10)


def test_bad_ranges_and_misaligned_positions_are_explained(train) -> None:
    with pytest.raises(ValueError, match="0 <= start < end"):
        SampleSkips([(5, 5)])
    # Position 7 with [2, 4) skipped below it: 5 kept samples, not a whole micro-step of 4.
    with pytest.raises(ValueError, match=r"\(5 kept samples below it\) is not a multiple"):
        build_data_loader(train, 7, MBS, 0, DP, skips=SampleSkips([(2, 4)]))
    assert list(build_data_loader(train, 6, MBS, 0, DP, skips=SampleSkips([(2, 4)])).batch_sampler)[0] == [6, 7]
