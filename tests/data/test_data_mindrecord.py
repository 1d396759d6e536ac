"""MindRecord round trip through make_token_data, layouts, and every error message."""
import subprocess
import sys

import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.data import MindDataset, TokenFile, build_dataset
from mindformers_core.tools import make_token_data as mtd

S = 8
TEXT_A = "The quick brown fox jumps over the lazy dog. " * 3
TEXT_B = "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich."
FIELD = "^train_dataset.data_path: .*"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    (d / "a.txt").write_text(TEXT_A, encoding="utf-8")
    (d / "b.txt").write_text(TEXT_B, encoding="utf-8")
    prefix = str(d / "out" / "tok")
    rc = mtd.main([str(d / "a.txt"), str(d / "b.txt"), "--output", prefix,
                   "--format", "bin", "npy", "mindrecord", "--seq-length", str(S)])
    assert rc == 0
    return d, prefix


def test_byte_tokenizer_stream(corpus):
    _d, prefix = corpus
    stream = np.load(prefix + ".npy")
    want = list(TEXT_A.encode()) + [0] + list(TEXT_B.encode()) + [0]
    assert stream.tolist() == want and stream.dtype == np.uint16
    np.testing.assert_array_equal(np.fromfile(prefix + ".bin", dtype="<u2"), stream)
    assert mtd.ByteTokenizer().decode(stream[:len(TEXT_A.encode())]) == TEXT_A


def test_mindrecord_round_trip_equals_token_file(corpus):
    _d, prefix = corpus
    md = MindDataset(prefix + ".mindrecord", seq_length=S, vocab_size=256)
    tf = TokenFile(prefix + ".bin", seq_length=S, vocab_size=256)
    assert md.num_samples == tf.num_samples == (len(np.load(prefix + ".npy")) - 1) // S
    idx = [5, 0, 5, md.num_samples - 1]                # repeated index, reversed order
    got, win = md.get(idx), tf.get(idx)
    np.testing.assert_array_equal(got["input_ids"], win[:, :-1])
    np.testing.assert_array_equal(got["labels"], win[:, 1:])
    np.testing.assert_array_equal(got["loss_mask"], np.ones((4, S), np.float32))
    model = ModelConfig(vocab_size=256, seq_length=S)
    a = build_dataset({"type": "MindDataset", "data_path": prefix + ".mindrecord"}, model, 3)
    b = build_dataset({"type": "TokenFile", "data_path": prefix + ".npy"}, model, 3)
    for step in range(3):
        x, y = a.micro_batch(step, 1, 2, 2), b.micro_batch(step, 1, 2, 2)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_cli_entry_point(tmp_path):
    (tmp_path / "c.txt").write_text("hello hello hello hello", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "mindformers_core.tools.make_token_data",
                          str(tmp_path / "c.txt"), "--output", str(tmp_path / "o"),
                          "--format", "npy", "--dtype", "uint32", "--no-eos"],
                         capture_output=True, text=True, check=True)
    assert "23 tokens" in out.stdout
    assert np.load(tmp_path / "o.npy").dtype == np.uint32


def test_cli_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mtd.main([str(tmp_path), "--output", str(tmp_path / "o"), "--format", "mindrecord"])
    assert "--seq-length (>= 1) is required" in capsys.readouterr().err
    assert mtd.main([str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o")]) == 2
    assert "input not found" in capsys.readouterr().err
    (tmp_path / "tiny.txt").write_text("hi", encoding="utf-8")
    assert mtd.main([str(tmp_path / "tiny.txt"), "--output", str(tmp_path / "o"),
                     "--format", "mindrecord", "--seq-length", "8"]) == 2
    assert "fewer than one sample of seq_length + 1 = 9" in capsys.readouterr().err


def _write_rows(path, rows, schema):
    from mindspore.mindrecord import FileWriter
    w = FileWriter(str(path), shard_num=1, overwrite=True)
    w.add_schema(schema, "t")
    if rows:
        w.write_raw_data(rows)
    w.commit()
    return str(path)


def test_input_ids_only_layout_is_shifted(tmp_path):
    rows = [{"input_ids": np.arange(i, i + S + 1, dtype=np.int32)} for i in range(4)]
    path = _write_rows(tmp_path / "x.mindrecord", rows, {"input_ids": {"type": "int32", "shape": [-1]}})
    got = MindDataset(path, S, 64).get([2])
    np.testing.assert_array_equal(got["input_ids"][0], np.arange(2, 2 + S))
    np.testing.assert_array_equal(got["labels"][0], np.arange(3, 3 + S))
    assert got["loss_mask"].sum() == S


def test_errors(tmp_path, corpus):
    _d, prefix = corpus
    with pytest.raises(ConfigError, match=FIELD + "MindRecord file not found"):
        MindDataset(str(tmp_path / "nope.mindrecord"), S)
    (tmp_path / "lonely.mindrecord").write_bytes(b"x")
    with pytest.raises(ConfigError, match=FIELD + "has no index file"):
        MindDataset(str(tmp_path / "lonely.mindrecord"), S)
    with pytest.raises(ConfigError, match=FIELD + "row 0 of .*: input_ids has length 8, but "
                                          "input_ids/labels must have 16 for model.seq_length 16"):
        MindDataset(prefix + ".mindrecord", 16)
    bad = [{"input_ids": np.full(S, 3, np.int32), "labels": np.full(S, 3, np.int32)},
           {"input_ids": np.full(S, 3, np.int32), "labels": np.array([1] * 7 + [70], np.int32)}]
    schema = {"input_ids": {"type": "int32", "shape": [-1]}, "labels": {"type": "int32", "shape": [-1]}}
    path = _write_rows(tmp_path / "big.mindrecord", bad, schema)
    with pytest.raises(ConfigError, match=FIELD + r"token id 70 in labels of row 1 .* outside "
                                          r"\[0, model.vocab_size=64\)"):
        MindDataset(path, S, 64)
    path = _write_rows(tmp_path / "nolab.mindrecord", [{"tokens": np.zeros(S, np.int32)}],
                       {"tokens": {"type": "int32", "shape": [-1]}})
    with pytest.raises(ConfigError, match=FIELD + r"has no input_ids column \(columns: \['tokens'\]\)"):
        MindDataset(path, S)


def test_unreadable_and_empty_files(tmp_path):
    (tmp_path / "g.mindrecord").write_bytes(b"x" * 100)
    (tmp_path / "g.mindrecord.db").write_bytes(b"y" * 100)
    with pytest.raises(ConfigError, match=FIELD + "cannot read MindRecord .*g.mindrecord'?: "
                                          "Invalid file"):
        MindDataset(str(tmp_path / "g.mindrecord"), S)
    path = _write_rows(tmp_path / "e.mindrecord", [], {"input_ids": {"type": "int32", "shape": [-1]}})
    with pytest.raises(ConfigError, match=FIELD + "holds no samples"):
        MindDataset(path, S)
