"""``training.rampup_batch_size: [start, increment, rampup_samples]``: a global batch ramp.

Megatron's rule, which upstream MindFormers follows: the global batch starts at ``start`` and
grows by ``increment`` every ``rampup_samples / ((global_batch_size - start) / increment)``
consumed samples until it reaches ``global_batch_size``; after ``rampup_samples`` samples it
stays there. Each step's batch is ``num_micro * local_batch_size * data_parallel`` samples, so
the number of accumulation steps follows the batch:
``num_micro(consumed) = batch(consumed) // (local_batch_size * data_parallel)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["BatchRamp", "build_batch_ramp"]


@dataclass(frozen=True)
class BatchRamp:
    """Global batch size as a pure function of consumed samples."""
    start: int
    increment: int
    rampup_samples: int
    global_batch_size: int
    micro_times_dp: int          # local_batch_size * data_parallel

    @property
    def samples_per_increment(self) -> float:
        n = (self.global_batch_size - self.start) // self.increment
        return self.rampup_samples / n if n > 0 else 0.0

    def global_batch(self, consumed_samples: int) -> int:
        """Global batch of the step that starts after ``consumed_samples`` samples."""
        if consumed_samples > self.rampup_samples or self.samples_per_increment == 0:
            return self.global_batch_size
        steps = int(consumed_samples / self.samples_per_increment)
        return min(self.start + steps * self.increment, self.global_batch_size)

    def num_micro_batches(self, consumed_samples: int) -> int:
        return self.global_batch(consumed_samples) // self.micro_times_dp


def build_batch_ramp(rampup: Optional[Sequence[int]], global_batch_size: int,
                     local_batch_size: int, data_parallel: int) -> Optional[BatchRamp]:
    """Check the ramp against the batch layout; ``None`` when no ramp is configured.

    The element checks (3 ints, start > 0, increment > 0, samples >= 0) are the config's;
    these are the cross-field rules, with Megatron's wording.
    """
    if rampup is None:
        return None
    start, increment, samples = (int(v) for v in rampup)
    unit = local_batch_size * data_parallel
    diff = global_batch_size - start
    if diff < 0:
        raise ValueError(
            f"training.rampup_batch_size: expected global batch size ({global_batch_size}) to be "
            f"greater than or equal to start batch size ({start}).")
    if diff % increment != 0:
        raise ValueError(
            f"training.rampup_batch_size: expected global batch size interval ({diff}) to be "
            f"divisible by global batch size increment ({increment}).")
    for size in range(start, global_batch_size + 1, increment):
        if size % unit != 0:
            raise ValueError(
                f"training.rampup_batch_size: current global batch size ({size}) is not divisible "
                f"by micro-batch-size ({local_batch_size}) times data parallel size "
                f"({data_parallel}).")
    return BatchRamp(start, increment, samples, global_batch_size, unit)
