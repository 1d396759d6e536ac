"""Unambiguous token data: the dtype/vocabulary sidecar written by make_token_data and checked
on load, the explicit dtype and plausibility checks for a raw .bin without one, float ids and
NaN/negative loss masks in MindRecord files as data errors naming file and row."""
import json

import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.data import MindDataset, TokenFile, build_dataset
from mindformers_core.data.token_meta import meta_path, read_token_meta, write_token_meta
from mindformers_core.tools import make_token_data as mtd

MODEL = ModelConfig(vocab_size=300, seq_length=8)


def ids(n=401, hi=300, seed=0):
    return np.random.default_rng(seed).integers(1, hi, size=n)


def test_uint32_file_read_as_default_uint16_is_refused(tmp_path):
    """The reproducer: a uint32 .bin with the default dtype trained on garbage, rc 0."""
    path = str(tmp_path / "t.bin")
    ids().astype("<u4").tofile(path)
    with pytest.raises(ConfigError, match=r"^train_dataset.dtype: .* raw token file without a "
                                          r"sidecar .* set train_dataset.dtype"):
        build_dataset({"type": "TokenFile", "data_path": path}, MODEL, seed=0)
    # an explicit but wrong dtype is caught by the zero-pattern check
    with pytest.raises(ConfigError, match=r"^train_dataset.dtype: .* 0 at every odd position .* "
                                          r"looks like a uint32 file"):
        build_dataset({"type": "TokenFile", "data_path": path, "dtype": "uint16"}, MODEL, seed=0)
    ds = build_dataset({"type": "TokenFile", "data_path": path, "dtype": "uint32"}, MODEL, seed=0)
    assert ds.num_samples == 50


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_make_token_data_sidecar_decides_the_dtype(tmp_path, dtype):
    stream = ids()
    for ext in ("bin", "npy"):
        path = mtd.write_token_file(stream, str(tmp_path / f"c.{ext}"), dtype)
        meta = read_token_meta(path)
        assert meta == {"format": "mindformers_core.tokens", "version": 1, "dtype": dtype,
                        "vocab_size": 256, "num_tokens": stream.size, "tokenizer": "byte"}
        tf = TokenFile(path, seq_length=8, vocab_size=300)      # no dtype given
        np.testing.assert_array_equal(tf.get([3])[0], stream[24:33])
    other = "uint32" if dtype == "uint16" else "uint16"
    with pytest.raises(ConfigError, match=rf"^train_dataset.dtype: '{other}' contradicts the token "
                                          rf"file's sidecar .* which says '{dtype}'"):
        TokenFile(str(tmp_path / "c.bin"), seq_length=8, dtype=other)


def test_sidecar_vocabulary_and_length_are_checked(tmp_path):
    path = mtd.write_token_file(ids(hi=200), str(tmp_path / "c.bin"), "uint16")
    with pytest.raises(ConfigError, match=r"tokenized with a vocabulary of 256 .* larger than "
                                          r"model.vocab_size=200"):
        TokenFile(path, seq_length=8, vocab_size=200)
    with open(path, "ab") as fh:
        fh.write(b"\0\0")
    with pytest.raises(ConfigError, match=r"holds 402 tokens, its sidecar .* says 401: the file "
                                          r"was changed"):
        TokenFile(path, seq_length=8)


@pytest.mark.parametrize("content,message", [
    ("[1]", "must be a JSON object"),
    ("{", "is unreadable"),
    ('{"format": "x"}', "format must be 'mindformers_core.tokens'"),
    ('{"format": "mindformers_core.tokens", "version": 9}', "version 9 is not supported"),
    ('{"format": "mindformers_core.tokens", "version": 1, "dtype": "float32"}',
     "dtype must be one of"),
    ('{"format": "mindformers_core.tokens", "version": 1, "dtype": "uint16", "vocab_size": 1.5,'
     ' "num_tokens": 3}', "vocab_size must be an integer >= 1"),
    ('{"format": "mindformers_core.tokens", "version": 1, "dtype": "uint16", "vocab_size": 9,'
     ' "num_tokens": -1}', "num_tokens must be an integer >= 0"),
])
def test_bad_sidecars_name_the_file_and_entry(tmp_path, content, message):
    path = str(tmp_path / "c.bin")
    ids().astype("<u2").tofile(path)
    with open(meta_path(path), "w") as fh:
        fh.write(content)
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: token sidecar .*c.bin.meta"
                                          r".json.*" + message):
        TokenFile(path, seq_length=8)


def test_write_token_meta_validates(tmp_path):
    with pytest.raises(ValueError, match="dtype must be one of"):
        write_token_meta(str(tmp_path / "x.bin"), "float16", 10, 5)
    out = write_token_meta(str(tmp_path / "x.bin"), "uint32", 10, 5, None)
    assert json.load(open(out))["tokenizer"] is None


def write_mindrecord(path, rows):
    from mindspore.mindrecord import FileWriter
    schema = {name: {"type": str(arr.dtype), "shape": [-1]} for name, arr in rows[0].items()}
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema(schema, "t")
    writer.write_raw_data(rows)
    writer.commit()
    return path


def mr_rows(n=3, S=8, id_dtype=np.int32, mask=None):
    out = []
    for i in range(n):
        out.append({"input_ids": np.arange(i, i + S).astype(id_dtype),
                    "labels": np.arange(i + 1, i + S + 1).astype(id_dtype),
                    "loss_mask": np.ones(S, np.float32)})
    if mask is not None:
        out[1]["loss_mask"] = mask
    return out


def test_float_mindrecord_ids_are_an_error(tmp_path):
    path = write_mindrecord(str(tmp_path / "f.mindrecord"), mr_rows(id_dtype=np.float32))
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: row 0 of .*f.mindrecord.*"
                                          r"input_ids holds float32 values; token ids must be "
                                          r"integers"):
        MindDataset(path, seq_length=8, vocab_size=64)


@pytest.mark.parametrize("bad,shown", [(np.nan, "nan"), (-1.0, "-1.0")])
def test_nan_or_negative_loss_mask_is_a_data_error(tmp_path, bad, shown):
    mask = np.ones(8, np.float32)
    mask[5] = bad
    path = write_mindrecord(str(tmp_path / "m.mindrecord"), mr_rows(mask=mask))
    with pytest.raises(ConfigError, match=rf"^train_dataset.data_path: row 1 of .*m.mindrecord.*"
                                          rf"loss_mask\[5\] is {shown}; a loss mask must be "
                                          rf"finite and >= 0"):
        MindDataset(path, seq_length=8, vocab_size=64)
