"""`train_dataset:` section. Owned by the data package.

Three sources (``type``):

* ``SyntheticMarkov`` (default): a built-in corpus drawn from a random Markov chain of order
  ``markov_order`` (1 or 2) over ``markov_vocab_size`` tokens (null = ``model.vocab_size``).
  Each context has ``markov_branching`` likely next tokens weighted by a
  Dirichlet(``markov_concentration``) draw, mixed with a uniform distribution of weight
  ``markov_smoothing`` (which keeps the chain ergodic). Its exact entropy rate is the loss floor.
* ``TokenFile``: a flat stream of token ids in ``data_path`` (``.bin`` raw, element type from
  its sidecar ``<data_path>.meta.json``, or ``dtype`` for a file without one; or ``.npy``),
  cut into windows of ``model.seq_length + 1`` tokens.
* ``MindDataset``: a MindRecord file ``data_path`` with ``input_ids``, ``labels``,
  ``loss_mask``, ``position_ids`` columns (as written by ``python -m mindformers_core.tools.make_token_data``).

``loss_mask_mode``: ``all`` keeps every label token (MindRecord: the file's ``loss_mask``);
``random_prefix`` additionally masks a prompt-like prefix of each sample, of length uniform in
[0, seq_length - 1] drawn from (seed, sample index), so micro-batches hold unequal token counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .errors import ConfigError
from .schema import Section, check, check_range

MARKOV_KEYS = ("markov_order", "markov_vocab_size", "markov_branching", "markov_concentration",
               "markov_smoothing")
FILE_TYPES = ("TokenFile", "MindDataset")


@dataclass
class DatasetConfig(Section):
    """Where training tokens come from. Default: the built-in synthetic Markov corpus."""
    type: Literal["SyntheticMarkov", "TokenFile", "MindDataset"] = "SyntheticMarkov"
    data_path: Optional[str] = None
    # element type of a raw .bin token file; null = the file's sidecar (<file>.meta.json,
    # written by tools/make_token_data) decides, and a .bin without one is an error
    dtype: Optional[Literal["uint16", "uint32"]] = None
    shuffle: bool = True                 # epoch-wise permutation (files; synthetic samples are i.i.d.)
    seed: Optional[int] = None           # None = training.seed
    loss_mask_mode: Literal["all", "random_prefix"] = "all"
    markov_order: int = 1
    markov_vocab_size: Optional[int] = None   # None = model.vocab_size
    markov_branching: int = 4
    markov_concentration: float = 0.5
    markov_smoothing: float = 0.01

    def _set_off_default(self, key: str) -> bool:
        """Written by the user with a non-default value (to_dict() output stays loadable)."""
        return key in self.explicit_keys and getattr(self, key) != getattr(type(self)(), key)

    def validate(self, path: str) -> None:
        check_range(self.markov_order, f"{path}.markov_order", lo=1, hi=2)
        check_range(self.markov_vocab_size, f"{path}.markov_vocab_size", lo=2)
        check_range(self.markov_branching, f"{path}.markov_branching", lo=1)
        check_range(self.markov_concentration, f"{path}.markov_concentration", lo=0, lo_open=True)
        check_range(self.markov_smoothing, f"{path}.markov_smoothing", lo=0, hi=1, lo_open=True)
        if self.seed is not None:
            check_range(self.seed, f"{path}.seed", lo=0)
        if self.type in FILE_TYPES:
            check(bool(self.data_path), f"{path}.data_path",
                  f"required when type is {self.type} (path of the token file)")
            for key in MARKOV_KEYS:
                if self._set_off_default(key):
                    raise ConfigError(f"{path}.{key}",
                                      f"only used by type SyntheticMarkov, not {self.type}")
        else:
            if self.data_path is not None:
                raise ConfigError(f"{path}.data_path", "not used by type SyntheticMarkov; "
                                  "set type: TokenFile or MindDataset to read a file")
        if self._set_off_default("dtype") and self.type != "TokenFile":
            raise ConfigError(f"{path}.dtype", f"only used by type TokenFile (.bin files), "
                              f"not {self.type}")
