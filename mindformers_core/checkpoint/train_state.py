"""The trainer's own counters, saved in every checkpoint."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """Counters of a run; everything needed besides tensors to continue it exactly.

    ``step``: completed optimizer steps, applied or skipped (the 1-based number of the last
    logged step). ``applied_steps``: steps whose update was applied; the lr schedule is
    evaluated at this index, so a skipped step does not advance the lr (as upstream, where
    the optimizer's ``global_step`` does not move). ``consumed_samples``: global samples
    drawn so far (drives ``rampup_batch_size``). ``consecutive_skipped`` / ``total_skipped``:
    steps skipped for a non-finite or over-threshold gradient norm or a loss-scale overflow.
    """
    step: int = 0
    applied_steps: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    consecutive_skipped: int = 0
    total_skipped: int = 0
    total_clipped: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})
