"""`train_dataset:` section. Owned by the data package (field set may grow)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .schema import Section, check_range


@dataclass
class DatasetConfig(Section):
    """Where training tokens come from. Default: the built-in synthetic Markov corpus."""
    type: Literal["SyntheticMarkov", "TokenFile", "MindDataset"] = "SyntheticMarkov"
    data_path: Optional[str] = None
    shuffle: bool = True
    seed: Optional[int] = None           # None = training.seed
    markov_order: int = 1

    def validate(self, path: str) -> None:
        check_range(self.markov_order, f"{path}.markov_order", lo=1)
