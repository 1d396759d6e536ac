"""Megatron .bin/.idx (byte layout, read, write), blends (proportions, determinism, resume),
EOD masks, make_token_data's tokenizer / idx / MindRecord size options."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.data.blend import BlendedSource, blend_assignment
from mindformers_core.core.documents import document_positions_and_mask
from mindformers_core.data.eod import eod_loss_mask
from mindformers_core.data.indexed import open_indexed_tokens, read_index, write_indexed
from mindformers_core.data.run_data import build_run_datasets
from mindformers_core.tools import make_token_data as mtd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_idx_bytes_are_megatrons_layout(tmp_path):
    prefix = str(tmp_path / "c")
    write_indexed(prefix, [[1, 2, 3], [4, 5]], "uint16")
    want = (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8)
            + struct.pack("<QQ", 2, 3) + struct.pack("<2i", 3, 2) + struct.pack("<2q", 0, 6)
            + struct.pack("<3q", 0, 1, 2))
    assert open(prefix + ".idx", "rb").read() == want
    assert open(prefix + ".bin", "rb").read() == struct.pack("<5H", 1, 2, 3, 4, 5)
    info = read_index(prefix + ".idx")
    assert info.num_documents == 2 and info.num_tokens == 5 and info.dtype == np.uint16
    tokens, _ = open_indexed_tokens(prefix + ".bin")
    assert tokens.tolist() == [1, 2, 3, 4, 5]


def test_reads_an_index_written_by_hand_with_int32_and_multi_sequence_documents(tmp_path):
    """Megatron documents may hold several sequences (sentence splitting): doc index [0, 2, 3]."""
    prefix = str(tmp_path / "m")
    seqs = [[7, 8], [9], [10, 11, 12]]
    with open(prefix + ".bin", "wb") as fh:
        for s in seqs:
            fh.write(np.asarray(s, "<i4").tobytes())
    with open(prefix + ".idx", "wb") as fh:
        fh.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 3, 3))
        fh.write(np.asarray([2, 1, 3], "<i4").tobytes() + np.asarray([0, 8, 12], "<i8").tobytes()
                 + np.asarray([0, 2, 3], "<i8").tobytes())
    tokens, info = open_indexed_tokens(prefix)
    assert tokens.tolist() == [7, 8, 9, 10, 11, 12] and info.num_documents == 2
    assert info.dtype == np.int32


def test_broken_indexes_are_errors_naming_the_field(tmp_path):
    prefix = str(tmp_path / "b")
    write_indexed(prefix, [[1, 2, 3]], "uint16")
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: index file not found"):
        open_indexed_tokens(str(tmp_path / "none"))
    data = open(prefix + ".idx", "rb").read()
    open(prefix + ".idx", "wb").write(b"XXXXXXXXX" + data[9:])
    with pytest.raises(ConfigError, match="is not a Megatron .idx file"):
        open_indexed_tokens(prefix)
    open(prefix + ".idx", "wb").write(data[:-8])
    with pytest.raises(ConfigError, match="its header implies"):
        open_indexed_tokens(prefix)
    open(prefix + ".idx", "wb").write(data)
    open(prefix + ".bin", "ab").write(b"\x00\x00")
    with pytest.raises(ConfigError, match="the index describes 6"):
        open_indexed_tokens(prefix)
    bad = data[:17] + struct.pack("<B", 6) + data[18:]
    open(prefix + ".idx", "wb").write(bad)
    with pytest.raises(ConfigError, match="dtype code 6 is not an integer token type"):
        open_indexed_tokens(prefix)


def test_blend_proportions_within_2_percent_over_10k_and_deterministic():
    w = [0.7, 0.2, 0.1]
    corpus, draw, counts = blend_assignment(w, 10_000)
    share = np.bincount(corpus, minlength=3) / 10_000
    assert np.abs(share - w).max() < 0.02
    assert np.abs(share - w).max() < 1e-3          # greedy rule: within one sample
    for d in range(3):
        assert draw[corpus == d].tolist() == list(range(int(counts[d])))
    # continuing from a prefix gives the same assignment (resume)
    c1, d1, k1 = blend_assignment(w, 4_000)
    c2, d2, _ = blend_assignment(w, 6_000, 4_000, k1)
    assert np.concatenate([c1, c2]).tolist() == corpus.tolist()
    assert np.concatenate([d1, d2]).tolist() == draw.tolist()
    with pytest.raises(ValueError, match="blend weights must be finite and > 0"):
        blend_assignment([1.0, 0.0], 3)


class _Src:
    def __init__(self, n, tag):
        self.num_samples, self.tag = n, tag

    def get(self, idx, s=None):
        return np.stack([np.array([self.tag, i]) for i in idx])


def test_blended_source_maps_positions_to_shuffled_epochs_of_each_corpus():
    src = BlendedSource([_Src(5, 0), _Src(3, 1)], [1.0, 1.0], seed=2)
    rows = src.get(np.arange(16))
    for tag, n in ((0, 5), (1, 3)):
        picked = rows[rows[:, 0] == tag][:, 1]
        assert sorted(picked[:n].tolist()) == list(range(n))     # one epoch = a permutation
    again = BlendedSource([_Src(5, 0), _Src(3, 1)], [1.0, 1.0], seed=2)
    assert again.get([15, 3, 9]).tolist() == rows[[15, 3, 9]].tolist()   # random access


def test_eod_masks_match_megatron_semantics():
    x = np.array([[5, 6, 0, 7, 8, 0, 9]])
    assert eod_loss_mask(x, 0).tolist() == [[1, 1, 0, 1, 1, 0, 1]]
    pos, allowed = document_positions_and_mask(x, 0)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 2, 0]]
    doc = [0, 0, 0, 1, 1, 1, 2]
    want = np.array([[u <= t and doc[u] == doc[t] for u in range(7)] for t in range(7)])
    np.testing.assert_array_equal(allowed[0], want)


def _base(**train_dataset):
    return {"training": {"steps": 4, "local_batch_size": 2, "global_batch_size": 2},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"vocab_size": 256, "seq_length": 8}, "train_dataset": train_dataset}


def test_blend_and_eod_config_rules():
    for name in ("reset_position_ids", "reset_attention_mask"):
        assert getattr(load_config(_base(type="PydocText", **{name: True})).train_dataset, name)
        cfg = _base(type="PydocText", **{name: True})
        cfg["eval_dataset"] = {"type": "PydocText"}
        with pytest.raises(ConfigError, match=rf"^eval_dataset\.{name}: False differs from "
                           rf"train_dataset\.{name} \(True\): the model applies one document "
                           "masking to every batch it runs"):
            load_config(cfg)
    with pytest.raises(ConfigError, match=r"^train_dataset.blend: needs type TokenFile or "):
        load_config(_base(type="PydocText", blend=[[1, "a"]]))
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: not used with blend"):
        load_config(_base(type="IndexedDataset", data_path="x", blend=[[1, "a"]]))
    with pytest.raises(ConfigError, match=r"^train_dataset.blend\[1\]\[0\]: \(weight\) must be "):
        load_config(_base(type="IndexedDataset", blend=[[1, "a"], [0, "b"]]))
    with pytest.raises(ConfigError, match=r"^train_dataset.blend\[0\]: must be \[weight, path\]"):
        load_config(_base(type="IndexedDataset", blend=[[1, "a", 3]]))
    with pytest.raises(ConfigError, match=r"^train_dataset.blend\[0\]\[1\]: \(path\) must be "):
        load_config(_base(type="IndexedDataset", blend=[[1, 5]]))
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: required when type is "
                                          "IndexedDataset"):
        load_config(_base(type="IndexedDataset"))
    with pytest.raises(ConfigError, match=r"^train_dataset.eod_id: must be >= 0"):
        load_config(_base(type="PydocText", eod_id=-1))


def test_blend_of_two_indexed_corpora_trains_with_eod_masking_and_held_out_parts(tmp_path):
    rng = np.random.default_rng(0)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_indexed(a, [rng.integers(1, 100, 50) for _ in range(20)], "uint16")
    write_indexed(b, [rng.integers(100, 200, 30) for _ in range(20)], "uint16")
    cfg = load_config(_base(type="IndexedDataset", blend=[[3, a], [1, b + ".idx"]],
                            validation_split=0.1, eod_mask_loss=True, eod_id=7))
    train, held = build_run_datasets(cfg)
    batch = train.samples(np.arange(400))
    from_a = (batch["input_ids"] < 100).all(1)
    assert abs(from_a.mean() - 0.75) < 0.02
    assert held is not None and held.source.weights.tolist() == [0.75, 0.25]
    # eod id 7 masks exactly the inputs equal to 7
    np.testing.assert_array_equal(batch["loss_mask"] == 0, batch["input_ids"] == 7)
    # resume: a fresh dataset at the same position serves the same samples
    again, _ = build_run_datasets(cfg)
    np.testing.assert_array_equal(again.samples([399, 5])["input_ids"],
                                  batch["input_ids"][[399, 5]])


def test_make_token_data_writes_idx_and_a_small_mindrecord(tmp_path):
    docs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    docs[0].write_text("hello world " * 1500, encoding="utf-8")
    docs[1].write_text("second document " * 500, encoding="utf-8")
    out = str(tmp_path / "out" / "c")
    assert mtd.main([str(d) for d in docs] + ["--output", out, "--format", "idx", "bin",
                                              "mindrecord", "--seq-length", "64"]) == 0
    tokens, info = open_indexed_tokens(out)
    flat = np.fromfile(out + ".bin", "<u2")      # also a TokenFile: the same stream
    np.testing.assert_array_equal(np.asarray(tokens), flat)
    np.testing.assert_array_equal(flat, mtd.tokenize_files([str(d) for d in docs]))
    assert info.num_documents == 2 and info.sequence_lengths.tolist() == [18001, 8001]
    assert flat[18000] == 0 and flat[-1] == 0                   # end-of-document ids
    # ~26k tokens: the MindRecord is sized to its content (FileWriter's defaults gave ~50 MB)
    assert os.path.getsize(out + ".mindrecord") < 2 * 2 ** 20
    assert mtd.mindrecord_sizes(400, 1024) == (16384, 32768)
    assert mtd.mindrecord_sizes(100_000, 16 * 4096)[1] == 128 * 2 ** 20   # 1/64 of 6.5 GB


def test_make_token_data_reports_tokens_per_second(tmp_path):
    (tmp_path / "a.txt").write_text("abc", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mindformers_core.tools.make_token_data",
                           str(tmp_path / "a.txt"), "--output", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "4 tokens (byte-level, vocab 256) from 1 files in " in proc.stdout
    assert " tokens/s)" in proc.stdout


def test_make_token_data_and_train_tokenizer_name_a_non_text_input(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("text", encoding="utf-8")
    (tmp_path / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert mtd.main([str(tmp_path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'img.png'} is not UTF-8 text (invalid start byte at byte 0)" in err
    pytest.importorskip("tokenizers")
    from mindformers_core.tools import train_tokenizer
    assert train_tokenizer.main([str(tmp_path), "--output", str(tmp_path / "t.json")]) == 2
    assert f"{tmp_path / 'img.png'} is not UTF-8 text" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_tokenizer.main([str(tmp_path / "a.txt"), "--output", "x.json", "--vocab-size", "10"])
    assert "--vocab-size must be >= 257" in capsys.readouterr().err


def test_more_index_errors(tmp_path):
    prefix = str(tmp_path / "c")
    write_indexed(prefix, [[1, 2], [3]], "uint16")
    data = bytearray(open(prefix + ".idx", "rb").read())
    os.remove(prefix + ".bin")
    with pytest.raises(ConfigError, match=r"^train_dataset.data_path: data file not found"):
        open_indexed_tokens(prefix)
    write_indexed(prefix, [[1, 2], [3]], "uint16")
    bad = bytearray(data)
    bad[9:17] = struct.pack("<Q", 2)
    open(prefix + ".idx", "wb").write(bytes(bad))
    with pytest.raises(ConfigError, match="index version 2, only 1 is known"):
        open_indexed_tokens(prefix)
    bad = bytearray(data)
    off = 9 + 8 + 1 + 16 + 2 * 4 + 8          # the second sequence's pointer
    bad[off:off + 8] = struct.pack("<q", 6)
    open(prefix + ".idx", "wb").write(bytes(bad))
    with pytest.raises(ConfigError, match="sequences are not stored back to back"):
        open_indexed_tokens(prefix)
    write_indexed(prefix, [[]], "uint16")
    with pytest.raises(ConfigError, match="holds no tokens"):
        open_indexed_tokens(prefix)
    with pytest.raises(ValueError, match="token ids must fit uint16"):
        write_indexed(prefix, [[70000]], "uint16")
    with pytest.raises(ValueError, match="one weight per blended source"):
        BlendedSource([_Src(2, 0)], [1.0, 2.0], seed=0)
