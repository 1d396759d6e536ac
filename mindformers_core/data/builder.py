"""build_dataset: the `train_dataset:` section -> a deterministic, resumable, sharded dataset.

``TrainDataset`` joins a source (SyntheticMarkov, TokenFile or MindDataset: anything with
``get(indices, seq_length)`` and ``num_samples``) with a :class:`GlobalBatchSampler`:

    ds.micro_batch(step, micro_index, num_micro, local_batch_size, step_start=None)
        -> {"input_ids": int32 [B, S], "labels": int32 [B, S], "loss_mask": float32 [B, S]}

``step_start`` is the stream position of the optimizer step's first sample; by default
``step * G`` with ``G = world * local_batch_size * num_micro`` (constant global batch). With a
batch ramp the trainer passes ``ds.consumed_samples`` read before the step. Serving the last
micro-batch of a step sets ``consumed_samples = step_start + G``: that int is the whole resume
state (``state_dict()``), because every batch is a pure function of its stream positions.

Loss mask: ``all`` -> the source's mask (ones for token windows); ``random_prefix`` -> also
zero the first ``P`` label positions of each sample, ``P`` uniform in ``[0, S - 1]`` drawn from
``default_rng([seed, 3, sample_index])`` (at least one label token always counts).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ..config.dataset import DatasetConfig
from ..errors import ConfigError
from .eod import eod_loss_mask
from .markov import SyntheticMarkov
from .mindrecord import MindDataset
from .sampler import GlobalBatchSampler
from .token_file import TokenFile

__all__ = ["TrainDataset", "build_dataset", "build_source", "file_source", "random_prefix_mask"]


def random_prefix_mask(indices: np.ndarray, seq_length: int, seed: int) -> np.ndarray:
    """``[n, S]`` float32 mask: zeros on a prefix of length ``P_i ~ U{0..S-1}`` per sample."""
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    prefix = np.array([np.random.default_rng([seed, 3, int(i)]).integers(0, seq_length)
                       for i in indices], dtype=np.int64)
    return (np.arange(seq_length)[None, :] >= prefix[:, None]).astype(np.float32)


class TrainDataset:
    """A source plus the global-batch sampler; see the module docstring for the contract."""

    def __init__(self, source: Any, seq_length: int, vocab_size: int, seed: int,
                 shuffle: bool = True, rank: int = 0, world: int = 1,
                 loss_mask_mode: str = "all", kind: Optional[str] = None,
                 eod_mask_id: Optional[int] = None):
        if loss_mask_mode not in ("all", "random_prefix"):
            raise ConfigError("train_dataset.loss_mask_mode",
                              f"must be one of ['all', 'random_prefix'], got {loss_mask_mode!r}")
        self.source = source
        self.kind = kind or type(source).__name__
        self.seq_length = int(seq_length)
        self.vocab_size = int(vocab_size)
        self.seed = int(seed)
        self.loss_mask_mode = loss_mask_mode
        self.eod_mask_id = eod_mask_id   # train_dataset.eod_mask_loss: no loss from this input
        self.sampler = GlobalBatchSampler(source.num_samples, seed, shuffle, rank, world)

    # -- facts -------------------------------------------------------------------------------
    @property
    def entropy_floor(self) -> Optional[float]:
        """Exact entropy rate in nats/token when the source knows it (SyntheticMarkov)."""
        return getattr(self.source, "entropy_floor", None)

    @property
    def num_samples(self) -> Optional[int]:
        return self.source.num_samples

    @property
    def rank(self) -> int:
        return self.sampler.rank

    @property
    def world(self) -> int:
        return self.sampler.world

    @property
    def consumed_samples(self) -> int:
        return self.sampler.consumed_samples

    @property
    def epoch(self) -> int:
        """Epoch of the next position to be read (0 for the infinite synthetic corpus)."""
        return self.sampler.epoch_of(self.sampler.consumed_samples)

    # -- batches -----------------------------------------------------------------------------
    def samples(self, indices) -> Dict[str, np.ndarray]:
        """Samples by index: ``input_ids``/``labels`` int32 ``[n, S]``, ``loss_mask`` float32."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        got = self.source.get(indices, self.seq_length)
        if isinstance(got, dict):
            batch = dict(got)
        else:
            batch = {"input_ids": np.ascontiguousarray(got[:, :-1]),
                     "labels": np.ascontiguousarray(got[:, 1:]),
                     "loss_mask": np.ones((indices.size, self.seq_length), np.float32)}
        if self.loss_mask_mode == "random_prefix":
            batch["loss_mask"] = batch["loss_mask"] * random_prefix_mask(
                indices, self.seq_length, self.seed)
        if self.eod_mask_id is not None:
            batch["loss_mask"] = batch["loss_mask"] * eod_loss_mask(batch["input_ids"],
                                                                    self.eod_mask_id)
        return batch

    def micro_batch(self, step: int, micro_index: int, num_micro: int, local_batch_size: int,
                    step_start: Optional[int] = None) -> Dict[str, np.ndarray]:
        """This rank's micro-batch ``micro_index`` (of ``num_micro``) of optimizer step ``step``."""
        global_batch = self.world * int(local_batch_size) * int(num_micro)
        if step_start is None:
            step_start = int(step) * global_batch
        positions = self.sampler.micro_positions(step_start, micro_index, num_micro,
                                                 local_batch_size)
        batch = self.samples(self.sampler.sample_indices(positions))
        if micro_index == num_micro - 1:
            self.sampler.consumed_samples = int(step_start) + global_batch
        return batch

    def next_batch(self, batch_size: int) -> Dict[str, np.ndarray]:
        """The next step's batch for this rank without accumulation (one micro-batch)."""
        return self.micro_batch(0, 0, 1, batch_size, step_start=self.consumed_samples)

    def global_batch_indices(self, step_start: int, global_batch: int) -> np.ndarray:
        """Sample indices of one whole optimizer step (all ranks and micro-batches)."""
        return self.sampler.sample_indices(self.sampler.global_positions(step_start,
                                                                         global_batch))

    # -- resume ------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {"consumed_samples": int(self.sampler.consumed_samples), "kind": self.kind,
                "seed": self.seed, "num_samples": self.num_samples}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the data position; refuses a state from another corpus."""
        if "consumed_samples" not in state:
            raise ValueError("dataset state has no 'consumed_samples'")
        for key, mine in (("kind", self.kind), ("seed", self.seed),
                          ("num_samples", self.num_samples)):
            if key in state and state[key] != mine:
                raise ValueError(f"dataset state was saved with {key}={state[key]!r}, this "
                                 f"dataset has {key}={mine!r}; resuming would read other data")
        self.sampler.consumed_samples = int(state["consumed_samples"])


def build_source(ds_cfg, model_cfg, data_seed: int, tokenizer=None,
                 path: str = "train_dataset"):
    """The sample source of a dataset section (``tokenizer``: for text corpora; byte-level
    when None). Raises ``ConfigError`` naming ``<path>.<field>``."""
    vocab = int(model_cfg.vocab_size)
    seq_length = int(model_cfg.seq_length)
    if ds_cfg.type == "SyntheticMarkov":
        corpus_vocab = vocab if ds_cfg.markov_vocab_size is None else ds_cfg.markov_vocab_size
        if corpus_vocab > vocab:
            raise ConfigError(f"{path}.markov_vocab_size", (
                f"{corpus_vocab} exceeds model.vocab_size {vocab}: the corpus would hold "
                f"token ids the model cannot embed"))
        if seq_length < ds_cfg.markov_order:
            raise ConfigError(f"{path}.markov_order", (
                f"{ds_cfg.markov_order} needs model.seq_length >= {ds_cfg.markov_order}, "
                f"got {seq_length}"))
        return SyntheticMarkov(corpus_vocab, ds_cfg.markov_order, data_seed,
                               ds_cfg.markov_branching, ds_cfg.markov_concentration,
                               ds_cfg.markov_smoothing)
    if ds_cfg.type in ("TokenFile", "IndexedDataset"):
        return file_source(ds_cfg, ds_cfg.data_path, seq_length, vocab, f"{path}.data_path")
    if ds_cfg.type == "PydocText":
        from .text_corpus import pydoc_token_stream
        from .tokenizer import ByteTokenizer
        tokens = pydoc_token_stream(tokenizer or ByteTokenizer())
        return TokenFile("pydoc_data.topics", seq_length, vocab_size=vocab,
                         field=f"{path}.type", tokens=tokens)
    if isinstance(ds_cfg.data_path, list):   # several MindRecord files, rows in file order
        from .concat import ConcatSource
        return ConcatSource([MindDataset(file, seq_length, vocab, f"{path}.data_path[{i}]")
                             for i, file in enumerate(ds_cfg.data_path)])
    return MindDataset(ds_cfg.data_path, seq_length, vocab, f"{path}.data_path")


def file_source(ds_cfg, file: str, seq_length: int, vocab: int, field: str) -> TokenFile:
    """Token windows of one ``TokenFile`` (.bin/.npy) or ``IndexedDataset`` (Megatron
    .bin/.idx) file (``data_path`` or a ``blend`` entry)."""
    if ds_cfg.type == "IndexedDataset":
        from .indexed import open_indexed_tokens
        tokens, _ = open_indexed_tokens(file, field)
        return TokenFile(file, seq_length, vocab_size=vocab, field=field, tokens=tokens)
    return TokenFile(file, seq_length, ds_cfg.dtype, vocab, field)


def build_dataset(ds_cfg, model_cfg, seed: int, rank: int = 0, world: int = 1,
                  source=None, eod_mask_id: Optional[int] = None) -> TrainDataset:
    """Build the training dataset of ``ds_cfg`` (``DatasetConfig`` or dict) for ``model_cfg``.

    ``seed`` is ``training.seed``, used unless ``train_dataset.seed`` is set; ``rank``/``world``
    are the data-parallel rank and size; ``source`` replaces the one ``ds_cfg`` names (e.g. the
    training part of a held-out split); ``eod_mask_id``: the end-of-document id when
    ``eod_mask_loss`` is on. Raises ``ConfigError`` naming ``train_dataset.<field>``
    on any mismatch with the model (vocabulary, sequence length) or an unusable file.
    """
    if not isinstance(ds_cfg, DatasetConfig):
        ds_cfg = DatasetConfig.from_dict(ds_cfg, "train_dataset")
    data_seed = int(seed if ds_cfg.seed is None else ds_cfg.seed)
    if source is None:
        source = build_source(ds_cfg, model_cfg, data_seed)
    return TrainDataset(source, int(model_cfg.seq_length), int(model_cfg.vocab_size), data_seed,
                        ds_cfg.shuffle, rank, world, ds_cfg.loss_mask_mode, kind=ds_cfg.type,
                        eod_mask_id=eod_mask_id)
