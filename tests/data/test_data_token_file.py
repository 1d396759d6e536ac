"""TokenFile: windows against numpy slicing, .bin/.npy, and every error message."""
import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.model import ModelConfig
from mindformers_core.data import TokenFile, build_dataset

FIELD = "^train_dataset.data_path: "


@pytest.mark.parametrize("suffix,dtype", [(".bin", "uint16"), (".bin", "uint32"),
                                          (".npy", "uint16"), (".npy", "uint32")])
def test_windows_match_numpy(tmp_path, suffix, dtype):
    stream = np.random.default_rng(0).integers(0, 300, size=101).astype(dtype)
    path = str(tmp_path / f"t{suffix}")
    if suffix == ".bin":
        stream.tofile(path)
    else:
        np.save(path, stream)
    tf = TokenFile(path, seq_length=10, dtype=dtype, vocab_size=300)
    assert tf.num_samples == 10                       # (101 - 1) // 10
    win = tf.get([0, 9, 4])
    for row, i in zip(win, [0, 9, 4]):
        np.testing.assert_array_equal(row, stream[i * 10:i * 10 + 11].astype(np.int32))
    assert win.dtype == np.int32 and win.shape == (3, 11)
    assert isinstance(tf.tokens, np.memmap) or tf.tokens.base is not None   # memory-mapped


def test_build_dataset_shifts_inputs_and_labels(tmp_path):
    stream = np.arange(50, dtype=np.uint16)
    path = str(tmp_path / "s.bin")
    stream.tofile(path)
    ds = build_dataset({"type": "TokenFile", "data_path": path, "shuffle": False,
                        "dtype": "uint16"},
                       ModelConfig(vocab_size=64, seq_length=8), seed=0)
    b = ds.micro_batch(1, 0, 1, 2)                     # samples 2 and 3
    np.testing.assert_array_equal(b["input_ids"], [stream[16:24], stream[24:32]])
    np.testing.assert_array_equal(b["labels"], [stream[17:25], stream[25:33]])
    np.testing.assert_array_equal(b["loss_mask"], np.ones((2, 8), np.float32))
    assert ds.entropy_floor is None and ds.num_samples == 6


def _write(tmp_path, name, data):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, data)
    else:
        path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("name,data,dtype,msg", [
    ("none.bin", None, "uint16", "token file not found"),
    ("t.txt", b"abcd", "uint16", "must end in .bin or .npy"),
    ("odd.bin", b"abc", "uint16", "3 bytes, not a multiple of 2 .uint16.; wrong train_dataset.dtype"),
    ("odd4.bin", b"abcdef", "uint32", "6 bytes, not a multiple of 4"),
    ("empty.bin", b"", "uint16", "is empty"),
    ("short.bin", np.arange(8, dtype=np.uint16).tobytes(), "uint16",
     "holds 8 tokens, fewer than one sample of model.seq_length \\+ 1 = 9"),
    ("big.bin", np.array([1, 2, 64, 3] * 5, np.uint16).tobytes(), "uint16",
     r"token id 64 at position 2 of .* is outside \[0, model.vocab_size=64\)"),
    ("m.npy", np.zeros((4, 5), np.uint16), "uint16", r"must hold a 1-D integer array, got shape \(4, 5\)"),
    ("f.npy", np.zeros(20, np.float32), "uint16", "1-D integer array, got shape .* dtype float32"),
    ("neg.npy", np.array([0, 1, -1] + [0] * 10, np.int32), "uint16", "token id -1 at position 2"),
])
def test_errors(tmp_path, name, data, dtype, msg):
    path = str(tmp_path / name) if data is None else _write(tmp_path, name, data)
    with pytest.raises(ConfigError, match=FIELD + ".*" + msg):
        TokenFile(path, seq_length=8, dtype=dtype, vocab_size=64)


def test_bad_npy_is_reported(tmp_path):
    path = tmp_path / "bad.npy"
    path.write_bytes(b"not numpy at all")
    with pytest.raises(ConfigError, match=FIELD + ".* is not a readable .npy file"):
        TokenFile(str(path), seq_length=8)


def test_unknown_bin_dtype_is_reported(tmp_path):
    path = _write(tmp_path, "x.bin", np.arange(20, dtype=np.uint16).tobytes())
    with pytest.raises(ConfigError, match=r"^train_dataset.dtype: must be one of \['uint16', "
                                          r"'uint32'\], got 'int8'"):
        TokenFile(path, seq_length=8, dtype="int8")
