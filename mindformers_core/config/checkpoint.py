"""`checkpoint:` section (upstream field names). Owned by the trainer package."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .schema import Section, check_range


@dataclass
class CheckpointConfig(Section):
    enable_save: bool = False
    save_path: Optional[str] = None          # None = <output_dir>/checkpoint
    save_max: int = 3
    save_interleaved_steps: int = 1000
    no_save_optim: bool = False
    load_path: Optional[str] = None
    no_load_optim: bool = False
    prefix: str = "mindformers_core"

    def validate(self, path: str) -> None:
        check_range(self.save_max, f"{path}.save_max", lo=1)
        check_range(self.save_interleaved_steps, f"{path}.save_interleaved_steps", lo=1)
