"""`train_dataset:` section. Owned by the data package.

Sources (``type``):

* ``SyntheticMarkov`` (default): a built-in corpus drawn from a random Markov chain of order
  ``markov_order`` (1 or 2) over ``markov_vocab_size`` tokens (null = ``model.vocab_size``).
  Each context has ``markov_branching`` likely next tokens weighted by a
  Dirichlet(``markov_concentration``) draw, mixed with a uniform distribution of weight
  ``markov_smoothing`` (which keeps the chain ergodic). Its exact entropy rate is the loss floor.
* ``TokenFile``: a flat stream of token ids in ``data_path`` (``.bin`` raw, element type from
  its sidecar ``<data_path>.meta.json``, or ``dtype`` for a file without one; or ``.npy``),
  cut into windows of ``model.seq_length + 1`` tokens.
* ``MindDataset``: a MindRecord file ``data_path`` (or a list of them, rows read in file order)
  with ``input_ids``, ``labels``,
  ``loss_mask``, ``position_ids`` columns (as written by
  ``python -m mindformers_core.tools.make_token_data``).
* ``PydocText``: real English text every Python has (``pydoc_data.topics``, see
  ``data/text_corpus.py``), tokenized at start-up with the ``tokenizer:`` section (byte-level
  when absent) and cut into windows like a TokenFile.

* ``IndexedDataset``: Megatron's ``.bin``/``.idx`` pair at prefix ``data_path``
  (``data/indexed.py``), windows like a TokenFile.

``blend``, ``eod_mask_loss``, ``eod_id``, ``reset_position_ids``, ``reset_attention_mask``:
see ``config/corpus_rules.py``.

``validation_split``: the fraction of a finite source's samples held out (its tail) for the
evaluation of ``training.eval_interval``; 0 holds nothing out (``data/split.py``).

``loss_mask_mode``: ``all`` keeps every label token (MindRecord: the file's ``loss_mask``);
``random_prefix`` additionally masks a prompt-like prefix of each sample, of length uniform in
[0, seq_length - 1] drawn from (seed, sample index), so micro-batches hold unequal token counts.

Upstream's layout nests the source in ``dataloader:`` (``type``, ``dataset_files``,
``column_names``, ``shuffle``, ``python_multiprocessing``) with the loader options beside it;
both layouts load (config/compat/dataset_layout.py) and ``to_dict()`` writes the user's layout back.
Loader options: ``drop_remainder`` (True: batches are always whole here), ``num_parallel_workers``
and ``prefetch_size`` (>= 1; samples are read in-process, so they do not change the data),
``numa_enable`` and ``use_distribute_dataset`` (False only: not implemented).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Literal, Optional, Union

from .corpus_rules import check_corpus_fields
from .compat.dataset_layout import nest_dataloader, split_dataloader
from ..errors import ConfigError
from .compat.noop import require_noop
from .schema import Section, check, check_range

MARKOV_KEYS = ("markov_order", "markov_vocab_size", "markov_branching", "markov_concentration",
               "markov_smoothing")
FILE_TYPES = ("TokenFile", "MindDataset", "IndexedDataset")
TEXT_TYPES = ("PydocText",)


@dataclass
class DatasetConfig(Section):
    """Where training tokens come from. Default: the built-in synthetic Markov corpus."""
    type: Literal["SyntheticMarkov", "TokenFile", "MindDataset", "PydocText",
                  "IndexedDataset"] = "SyntheticMarkov"
    data_path: Optional[Union[str, List[str]]] = None   # a list: several MindRecord files
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
    drop_remainder: bool = True
    num_parallel_workers: int = 8
    prefetch_size: int = 1
    numa_enable: bool = False
    use_distribute_dataset: bool = False
    validation_split: float = 0.0        # held-out fraction of the samples (finite sources)
    blend: Optional[List[List[Any]]] = None    # [[weight, path], ...] instead of data_path
    eod_mask_loss: bool = False
    eod_id: Optional[int] = None         # None = the tokenizer's end-of-document id
    reset_position_ids: bool = False
    reset_attention_mask: bool = False

    @classmethod
    def from_dict(cls, data, path: str):
        flat, layout = split_dataloader(cls.mapping_of(data, path), path)
        obj = super().from_dict(flat, path)
        object.__setattr__(obj, "_layout", layout)
        return obj

    @property
    def source_layout(self) -> Optional[dict]:
        """How the user's ``dataloader:`` was written (None: the flat layout)."""
        return getattr(self, "_layout", None)

    def to_dict(self):
        out = super().to_dict()
        return out if self.source_layout is None else nest_dataloader(out, self.source_layout)

    def _set_off_default(self, key: str) -> bool:
        """Written by the user with a non-default value (to_dict() output stays loadable)."""
        return key in self.explicit_keys and getattr(self, key) != getattr(type(self)(), key)

    def validate(self, path: str) -> None:
        check_range(self.markov_order, f"{path}.markov_order", lo=1, hi=2)
        require_noop(f"{path}.drop_remainder", self.drop_remainder, (True,),
                     "keeping a last partial batch")
        require_noop(f"{path}.numa_enable", self.numa_enable, (False,), "NUMA-aware loading")
        require_noop(f"{path}.use_distribute_dataset", self.use_distribute_dataset, (False,),
                     "broadcasting batches within a data domain")
        check_range(self.num_parallel_workers, f"{path}.num_parallel_workers", lo=1)
        check_range(self.prefetch_size, f"{path}.prefetch_size", lo=1)
        check_range(self.markov_vocab_size, f"{path}.markov_vocab_size", lo=2)
        check_range(self.markov_branching, f"{path}.markov_branching", lo=1)
        check_range(self.markov_concentration, f"{path}.markov_concentration", lo=0, lo_open=True)
        check_range(self.markov_smoothing, f"{path}.markov_smoothing", lo=0, hi=1, lo_open=True)
        if self.seed is not None:
            check_range(self.seed, f"{path}.seed", lo=0)
        check_range(self.validation_split, f"{path}.validation_split", lo=0, hi=1, hi_open=True)
        check_corpus_fields(self, path)
        if self.type in FILE_TYPES + TEXT_TYPES:
            check(bool(self.data_path) or self.type in TEXT_TYPES or self.blend is not None,
                  f"{path}.data_path",
                  f"required when type is {self.type} (path of the token file)")
            check(self.data_path is None or self.type not in TEXT_TYPES, f"{path}.data_path",
                  f"not used by type {self.type} (its text is built in)")
            if isinstance(self.data_path, list):
                check(self.type == "MindDataset", f"{path}.data_path",
                      f"a list of files is read by type MindDataset only, not {self.type} "
                      f"(several {self.type} corpora: blend)")
                check(len(self.data_path) >= 2 and all(self.data_path), f"{path}.data_path",
                      f"a list must name two or more files, got {self.data_path!r}")
            for key in MARKOV_KEYS:
                if self._set_off_default(key):
                    raise ConfigError(f"{path}.{key}",
                                      f"only used by type SyntheticMarkov, not {self.type}")
        else:
            if self.validation_split > 0:
                raise ConfigError(f"{path}.validation_split", "needs a finite dataset; "
                                  "SyntheticMarkov is infinite (set eval_dataset instead)")
            if self.data_path is not None:
                raise ConfigError(f"{path}.data_path", "not used by type SyntheticMarkov; "
                                  "set type: TokenFile or MindDataset to read a file")
        if self._set_off_default("dtype") and self.type != "TokenFile":
            raise ConfigError(f"{path}.dtype", f"only used by type TokenFile (.bin files), "
                              f"not {self.type}")
