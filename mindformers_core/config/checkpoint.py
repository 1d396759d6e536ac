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
* ``load_format``: what ``load_path`` holds: ``native`` (this project's checkpoints: a resume),
  ``hf`` (Hugging Face safetensors: a file, or a directory with
  ``model.safetensors.index.json``), ``mindformers`` (an upstream MindFormers checkpoint) or
  ``auto`` (the default: detected). Weights of another format start a fine-tune: model
  weights only, step 0, a fresh optimizer (checkpoint/foreign.py);
* ``prefix``: file names are ``{prefix}_step{NNNNNNNN}.safetensors``.

Upstream's spellings of "nothing": ``load_path: ""`` means no checkpoint to load and
``prefix: null`` the default prefix (both are normalised when loading; ``save_path: ""`` is
the default directory). ``async_save`` writes the files in a background thread
(checkpoint/async_writer.py), still atomically.

Distributed (sharded) checkpoints, as upstream means the keys:

* ``remove_redundancy``: False (upstream's default): every rank writes every piece it holds, so
  each rank file is self-contained; True: each piece is written once, by one of the ranks that
  hold it, balanced over them (checkpoint/plan.py). Either loads, on any layout;
* ``load_worker_number``: threads that read and verify the rank files at load (>= 1);
* ``reshard_worker_num``: threads that merge the pieces into full tensors at load (>= 1);
* ``save_global_layout_cache``: upstream caches the gathered layout between saves; here each
  rank computes its share from its own layout without communication, so there is nothing to
  cache and both values write the same files;
* ``load_balanced``: False: every rank reads every rank file; True: each rank file is read
  and verified by one rank, balanced by bytes, and shared with the others over the world group
  (checkpoint/balanced_load.py; upstream reads each replica once and broadcasts it). The same
  tensors either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..errors import ConfigError
from .schema import Section, check_range

DEFAULT_PREFIX = "mindformers_core"
LOAD_FORMATS = ("auto", "native", "hf", "mindformers")


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
    load_format: str = "auto"
    prefix: str = DEFAULT_PREFIX   # null in the YAML = the default
    async_save: bool = False
    remove_redundancy: bool = False
    load_balanced: bool = False
    load_worker_number: int = 1
    save_global_layout_cache: bool = True
    reshard_worker_num: int = 1

    @classmethod
    def from_dict(cls, data, path: str):
        data = dict(cls.mapping_of(data, path))
        for name in ("load_path", "save_path"):
            if data.get(name) == "":
                data[name] = None     # upstream's "none"
        if "prefix" in data and data["prefix"] is None:
            data["prefix"] = DEFAULT_PREFIX
        return super().from_dict(data, path)

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
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"{path}.load_format", f"must be one of {list(LOAD_FORMATS)}, got "
                                                     f"{self.load_format!r}")
        # distributed-checkpoint options (checkpoint/sharded_save.py, checkpoint/plan.py)
        for name in ("load_worker_number", "reshard_worker_num"):
            check_range(getattr(self, name), f"{path}.{name}", lo=1)
