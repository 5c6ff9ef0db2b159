"""Micro-batches of sample indices for one data-parallel rank, resumable from consumed_samples.

Like Megatron's `MegatronPretrainingSampler`: the samples are read in index order (the dataset's
shuffle_idx already randomises them); every micro-step takes the next micro_batch_size * dp_size
samples and rank r gets slice [r*mbs, (r+1)*mbs) of them. A training step of global batch size
G = mbs * dp * accumulation consumes G samples, i.e. `accumulation` micro-steps, so the stream
does not depend on how samples are grouped into steps: when the global batch size ramps up, the
trainer just draws more micro-batches per step, and `consumed_samples` (the sum of the global
batch sizes so far, saved in the checkpoint) is always where the next micro-step starts. Resuming
with a new sampler at that value continues the stream exactly.

With `skips` (a rollback's exact data skip, orchestrator/contract/client/skips.py), the same is done on the KEPT
positions: the stream is the index order minus the skipped ranges, cut into micro-steps exactly
as above, and `consumed_samples` stays a data position (skipped samples included) from which the
kept stream resumes.
"""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.contract.client.skips import SampleSkips


class MegatronPretrainingSampler:
    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 dp_rank: int, dp_size: int, drop_last: bool = True, skips: SampleSkips | None = None) -> None:
        if total_samples <= 0:
            raise ValueError(f"no samples to iterate over (total_samples={total_samples})")
        if micro_batch_size <= 0 or dp_size <= 0:
            raise ValueError(f"micro_batch_size ({micro_batch_size}) and dp_size ({dp_size}) must be > 0")
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} is not in [0, dp_size={dp_size})")
        if not 0 <= consumed_samples <= total_samples:
            raise ValueError(
                f"consumed_samples {consumed_samples} is outside the dataset's {total_samples} samples: the "
                f"checkpoint is from a run with more training samples; raise train_samples"
            )
        self.skips = skips or SampleSkips()
        # Positions in the kept stream (= the positions themselves without skips).
        self.kept_start = self.skips.kept_below(consumed_samples)
        self.kept_total = self.skips.kept_below(total_samples)
        if self.kept_start % (micro_batch_size * dp_size):
            kept = f" ({self.kept_start} kept samples below it)" if self.skips else ""
            raise ValueError(
                f"consumed_samples {consumed_samples}{kept} is not a multiple of micro_batch_size*dp_size = "
                f"{micro_batch_size}*{dp_size}: global batch sizes must be multiples of it"
            )
        self.total_samples, self.consumed_samples = total_samples, consumed_samples
        self.micro_batch_size, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size
        self.drop_last = drop_last

    @property
    def samples_per_micro_step(self) -> int:
        return self.micro_batch_size * self.dp_size

    def __len__(self) -> int:
        """Micro-batches this rank will still yield."""
        remaining = self.kept_total - self.kept_start
        full, rest = divmod(remaining, self.samples_per_micro_step)
        return full + int(rest > self.dp_rank * self.micro_batch_size and not self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        step = self.samples_per_micro_step
        first = self.dp_rank * self.micro_batch_size
        position = self.skips.position_of
        for start in range(self.kept_start, self.kept_total - step + 1, step):
            yield [position(k) for k in range(start + first, start + first + self.micro_batch_size)]
        tail_start = self.kept_start + ((self.kept_total - self.kept_start) // step) * step
        if not self.drop_last and tail_start < self.kept_total:
            # The last partial micro-step, split across ranks as evenly as the order allows.
            mine = [position(k) for k in range(tail_start + first,
                                               min(self.kept_total, tail_start + first + self.micro_batch_size))]
            if mine:
                yield mine
