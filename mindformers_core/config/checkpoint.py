"""`checkpoint:` section (upstream field names). Owned by the trainer package.

* ``enable_save``: write a checkpoint every ``save_interleaved_steps`` optimizer steps and at
  the last step (a SIGTERM/SIGINT stop always saves, whatever this says);
* ``save_path``: directory of the checkpoint files (null = ``<output_dir>/checkpoint``);
* ``save_max``: how many of the newest checkpoints of ``prefix`` (of this run) to keep;
* ``keep_steps``: steps whose checkpoint is also written and never pruned by ``save_max``,
  e.g. the last step of a WSD stable phase, to extend the run from it later;
* ``no_save_optim``: save only model weights and train state (no masters/moments);
* ``load_path``: resume from a checkpoint file, or a directory meaning its newest complete
  checkpoint (a damaged newer one is reported and skipped);
* ``no_load_optim``: resume weights, step, data position and RNG, but start a fresh optimizer;
* ``prefix``: file names are ``{prefix}_step{NNNNNNNN}.safetensors``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .errors import ConfigError
from .schema import Section, check_range


@dataclass
class CheckpointConfig(Section):
    enable_save: bool = False
    save_path: Optional[str] = None          # None = <output_dir>/checkpoint
    save_max: int = 3
    save_interleaved_steps: int = 1000
    keep_steps: Optional[List[int]] = None
    no_save_optim: bool = False
    load_path: Optional[str] = None
    no_load_optim: bool = False
    prefix: str = "mindformers_core"

    def validate(self, path: str) -> None:
        check_range(self.save_max, f"{path}.save_max", lo=1)
        check_range(self.save_interleaved_steps, f"{path}.save_interleaved_steps", lo=1)
        for i, step in enumerate(self.keep_steps or ()):
            check_range(step, f"{path}.keep_steps[{i}]", lo=1)
        if not self.prefix or "/" in self.prefix or "\\" in self.prefix \
                or self.prefix.startswith("."):
            raise ConfigError(f"{path}.prefix", "must be a non-empty file name prefix without "
                                                f"path separators or a leading dot, got "
                                                f"{self.prefix!r}")
        for name in ("save_path", "load_path"):
            if getattr(self, name) == "":
                raise ConfigError(f"{path}.{name}", "must be null or a non-empty path")
