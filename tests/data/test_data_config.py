"""`train_dataset:` section validation, build_dataset model checks, and loss_mask_mode."""
import math

import numpy as np
import pytest

from mindformers_core.config.dataset import DatasetConfig
from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.data import build_dataset

MODEL = ModelConfig(vocab_size=64, seq_length=16)


def _load(d):
    return DatasetConfig.from_dict(d, "train_dataset")


@pytest.mark.parametrize("data,msg", [
    ({"type": "TokenFile"}, r"^train_dataset.data_path: required when type is TokenFile"),
    ({"type": "MindDataset"}, r"^train_dataset.data_path: required when type is MindDataset"),
    ({"data_path": "x.bin"}, r"^train_dataset.data_path: not used by type SyntheticMarkov"),
    ({"type": "TokenFile", "data_path": "x.bin", "markov_order": 2},
     r"^train_dataset.markov_order: only used by type SyntheticMarkov, not TokenFile"),
    ({"type": "MindDataset", "data_path": "x", "dtype": "uint32"},
     r"^train_dataset.dtype: only used by type TokenFile"),
    ({"markov_order": 3}, r"^train_dataset.markov_order: must be in \[1, 2\], got 3"),
    ({"markov_smoothing": 0}, r"^train_dataset.markov_smoothing: must be in \(0, 1\]"),
    ({"markov_concentration": -1.0}, r"^train_dataset.markov_concentration: must be > 0"),
    ({"markov_branching": 0}, r"^train_dataset.markov_branching: must be >= 1"),
    ({"markov_vocab_size": 1}, r"^train_dataset.markov_vocab_size: must be >= 2"),
    ({"seed": -1}, r"^train_dataset.seed: must be >= 0"),
    ({"loss_mask_mode": "prefix"}, r"^train_dataset.loss_mask_mode: must be one of \['all', 'random_prefix'\]"),
    ({"type": "Markov"}, r"^train_dataset.type: must be one of"),
    ({"dtype": "int8"}, r"^train_dataset.dtype: must be one of \['uint16', 'uint32'\]"),
    ({"markov_ordr": 1}, r"^train_dataset.markov_ordr: unknown key.*did you mean 'markov_order'"),
])
def test_section_errors(data, msg):
    with pytest.raises(ConfigError, match=msg):
        _load(data)


@pytest.mark.parametrize("data", [{}, {"type": "TokenFile", "data_path": "t.bin", "dtype": "uint32"},
                                  {"type": "MindDataset", "data_path": "t.mindrecord"}])
def test_to_dict_round_trip(data):
    cfg = _load(data)
    assert _load(cfg.to_dict()) == cfg
    assert _load({}).type == "SyntheticMarkov" and _load({}).loss_mask_mode == "all"


def test_build_dataset_model_checks():
    with pytest.raises(ConfigError, match=r"^train_dataset.markov_vocab_size: 100 exceeds "
                                          r"model.vocab_size 64"):
        build_dataset({"markov_vocab_size": 100}, MODEL, seed=0)
    with pytest.raises(ConfigError, match=r"^train_dataset.markov_order: 2 needs "
                                          r"model.seq_length >= 2, got 1"):
        build_dataset({"markov_order": 2}, ModelConfig(vocab_size=64, seq_length=1), seed=0)
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: .*token file not found"):
        build_dataset({"type": "TokenFile", "data_path": "/nonexistent/t.bin"}, MODEL, seed=0)


def test_small_corpus_vocab_inside_model_vocab():
    ds = build_dataset({"markov_vocab_size": 8, "markov_order": 2}, MODEL, seed=0)
    b = ds.micro_batch(0, 0, 1, 16)
    assert b["input_ids"].max() < 8 and ds.vocab_size == 64
    assert 0 < ds.entropy_floor < math.log(8)


def test_random_prefix_mask_gives_unequal_token_counts():
    plain = build_dataset({}, MODEL, seed=2)
    masked = build_dataset({"loss_mask_mode": "random_prefix"}, MODEL, seed=2)
    a, b = plain.micro_batch(0, 0, 1, 32), masked.micro_batch(0, 0, 1, 32)
    np.testing.assert_array_equal(a["input_ids"], b["input_ids"])     # only the mask changes
    np.testing.assert_array_equal(a["loss_mask"], np.ones((32, 16), np.float32))
    m = b["loss_mask"]
    assert set(np.unique(m).tolist()) <= {0.0, 1.0}
    assert (np.diff(m, axis=1) >= 0).all()             # zeros form a prefix, then ones
    assert (m[:, -1] == 1).all()                        # at least one label token counts
    counts = m.sum(axis=1)
    assert len(set(counts.tolist())) > 5 and counts.min() < 16
    # The mask belongs to the sample, not to the layout that reads it.
    r1 = build_dataset({"loss_mask_mode": "random_prefix"}, MODEL, seed=2, rank=1, world=2)
    np.testing.assert_array_equal(r1.micro_batch(0, 0, 1, 16)["loss_mask"], m[16:])
