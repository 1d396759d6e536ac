"""Upstream's `train_dataset.dataloader: {type: BlendedMegatronDatasetDataLoader, ...}` onto
this project's `type: IndexedDataset` (config/compat/megatron_loader.py): the mapping, every refusal,
the written-back layout, and the batches of a tiny .bin/.idx corpus against the native config."""
import numpy as np
import pytest
import yaml

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.dataset import DatasetConfig
from mindformers_core.data.indexed import write_indexed
from mindformers_core.data.run_data import build_run_datasets

COLUMNS = ["input_ids", "labels", "loss_mask", "position_ids"]


def _loader(**config):
    """Upstream's documented PyNative Megatron loader (its docs' field values)."""
    cfg = {"seed": 1234, "seq_length": 8, "split": "1, 0, 0", "eod": 1, "pad": -1,
           "eod_mask_loss": False, "reset_position_ids": False, "reset_attention_mask": False,
           "create_attention_mask": False, "create_compressed_eod_mask": False,
           "eod_pad_length": 128, "num_dataset_builder_threads": 1,
           "data_path": ["1", "/data/wiki_text_document"]}
    cfg.update(config)
    return {"dataloader": {"type": "BlendedMegatronDatasetDataLoader",
                           "datasets_type": "GPTDataset", "sizes": [1000, 0, 0],
                           "column_names": COLUMNS, "shuffle": False, "config": cfg},
            "drop_remainder": True, "num_parallel_workers": 8}


def _run(train_dataset, seq_length=8):
    return {"training": {"steps": 4, "local_batch_size": 2, "global_batch_size": 2},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"vocab_size": 256, "seq_length": seq_length},
            "train_dataset": train_dataset}


def test_maps_onto_indexed_dataset_fields_and_writes_its_layout_back():
    ds = DatasetConfig.from_dict(_loader(eod_mask_loss=True), "d")
    native = DatasetConfig.from_dict({"type": "IndexedDataset",
                                      "data_path": "/data/wiki_text_document", "seed": 1234,
                                      "eod_id": 1, "eod_mask_loss": True, "shuffle": True}, "d")
    assert ds == native
    out = ds.to_dict()
    assert out["dataloader"]["type"] == "BlendedMegatronDatasetDataLoader"
    assert out["dataloader"]["config"]["data_path"] == [1, "/data/wiki_text_document"]
    assert out["dataloader"]["config"]["seed"] == 1234
    assert out["dataloader"]["sizes"] == [1000, 0, 0]
    assert out["dataloader"]["column_names"] == COLUMNS
    assert not {"type", "data_path", "seed", "eod_id", "blend"} & set(out)
    assert DatasetConfig.from_dict(out, "d") == ds
    assert DatasetConfig.from_dict(out, "d").to_dict() == out


def _without(**drop):
    data = _loader()
    for key in drop:
        del data["dataloader"]["config"][key]
    return data


def test_data_path_forms():
    blend = DatasetConfig.from_dict(_loader(data_path=["0.3", "a", 0.7, "b"]), "d")
    assert (blend.data_path, blend.blend) == (None, [[0.3, "a"], [0.7, "b"]])
    assert blend.to_dict()["dataloader"]["config"]["data_path"] == [0.3, "a", 0.7, "b"]
    for one in ("a", ["a"], ["2", "a"]):
        assert DatasetConfig.from_dict(_loader(data_path=one), "d").data_path == "a"
    data = _without(seed=1)
    data["dataloader"]["config"]["random_seed"] = 7
    seeded = DatasetConfig.from_dict(data, "d")
    assert seeded.seed == 7 and "random_seed" in seeded.to_dict()["dataloader"]["config"]


W = r"^d\.dataloader\.config\."


@pytest.mark.parametrize("data,msg", [
    (_without(data_path=1), W + r"data_path: required for BlendedMegatronDatasetDataLoader"),
    ({"dataloader": {"type": "BlendedMegatronDatasetDataLoader"}},
     W + r"data_path: required for BlendedMegatronDatasetDataLoader"),
    (_loader(data_path=["1", "a", "b"]), W + r"data_path: must alternate weight and prefix"),
    (_loader(data_path=["x", "a"]), W + r"data_path\[0\]: \(weight\) must be a number"),
    (_loader(data_path=["1", "a", "0", "b"]), r"^d\.blend\[1\]\[0\]: \(weight\) must be"),
    (_loader(data_path={"a": 1}), W + r"data_path: expected a prefix or a list"),
    (_loader(random_seed=3), W + r"random_seed: given together with seed; keep one"),
    (_loader(split="0.9, 0.1, 0"), W + r"split: '0.9, 0.1, 0' needs held-out test/eval parts "
                                       r"of a Megatron dataset, which is not implemented"),
    (_loader(split="1, 0"), W + r"split: must be three weights"),
    (_loader(pad=0), W + r"pad: 0 needs dropping the loss on pad tokens, which is not "
                         r"implemented"),
    (_loader(create_compressed_eod_mask="yes"), W + r"create_compressed_eod_mask: expected "),
    (_loader(num_dataset_builder_threads=0), W + r"num_dataset_builder_threads: must be >= 1"),
    (_loader(seq_length=0), W + r"seq_length: must be >= 1, got 0"),
    (_loader(eod=-1, reset_position_ids=True), r"^d\.eod_id: must be >= 0, got -1"),
    (_loader(eod_mask_los=True), W + r"eod_mask_los: unknown key; .*did you mean "
                                     r"'eod_mask_loss'\?"),
    ({"dataloader": {**_loader()["dataloader"], "datasets_type": "BertDataset"}},
     r"^d\.dataloader\.datasets_type: 'BertDataset' needs Megatron dataset types other than "
     r"GPTDataset, which is not implemented"),
    ({"dataloader": {**_loader()["dataloader"], "sizes": [10, 5, 0]}},
     r"^d\.dataloader\.sizes: \[10, 5, 0\] needs Megatron test/eval datasets, which is not "
     r"implemented"),
    ({"dataloader": {**_loader()["dataloader"], "sizes": [10, 0]}},
     r"^d\.dataloader\.sizes: must be three sample counts"),
    ({"dataloader": {**_loader()["dataloader"], "dataset_files": "a"}},
     r"^d\.dataloader\.dataset_files: unknown key"),
    ({"dataloader": {**_loader()["dataloader"], "config": "x"}},
     r"^d\.dataloader\.config: expected a mapping, got str"),
    ({**_loader(), "eod_mask_loss": True},
     r"^d\.eod_mask_loss: given both flat and inside dataloader\.config:"),
])
def test_errors_name_the_field(data, msg):
    with pytest.raises(ConfigError, match=msg):
        DatasetConfig.from_dict(data, "d")


def test_seq_length_must_match_the_model():
    with pytest.raises(ConfigError, match=r"^train_dataset\.dataloader\.config\.seq_length: 8 "
                                          r"must match model\.seq_length 16"):
        load_config(_run(_loader(), seq_length=16))


def test_batches_equal_the_native_indexed_config(tmp_path):
    rng = np.random.default_rng(0)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_indexed(a, [rng.integers(2, 100, 40) for _ in range(10)], "uint16")
    write_indexed(b, [rng.integers(100, 200, 30) for _ in range(10)], "uint16")
    text = yaml.safe_dump(_run(_loader(data_path=["3", a, "1", b], eod_mask_loss=True)))
    path = tmp_path / "upstream.yaml"
    path.write_text(text, encoding="utf-8")
    upstream = load_config(str(path))
    native = load_config(_run({"type": "IndexedDataset", "blend": [[3, a], [1, b]],
                               "seed": 1234, "eod_id": 1, "eod_mask_loss": True}))
    got, _ = build_run_datasets(upstream)
    want, _ = build_run_datasets(native)
    idx = np.arange(64)
    for key, value in want.samples(idx).items():
        np.testing.assert_array_equal(got.samples(idx)[key], value, err_msg=key)
    # the written-back upstream layout loads to the same config
    assert load_config(upstream.to_dict()).train_dataset == native.train_dataset


def test_the_compressed_eod_mask_is_the_document_mask():
    """``create_compressed_eod_mask: True`` (upstream's flash-attention form of the mask inside
    each document) turns ``reset_attention_mask`` on (models/documents.py), and survives
    the round trip through to_dict."""
    ds = DatasetConfig.from_dict(_loader(create_compressed_eod_mask=True), "d")
    assert ds.reset_attention_mask and not ds.reset_position_ids and ds.eod_id == 1
    again = DatasetConfig.from_dict(ds.to_dict(), "d")
    assert again.reset_attention_mask
    assert again.to_dict()["dataloader"]["config"]["create_compressed_eod_mask"] is True
    both = DatasetConfig.from_dict(_loader(reset_position_ids=True, reset_attention_mask=True),
                                   "d")
    assert both.reset_position_ids and both.reset_attention_mask
