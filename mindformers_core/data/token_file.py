"""TokenFile: a flat stream of token ids on disk, memory-mapped, cut into training windows.

Formats: ``.bin`` (raw little-endian ``uint16`` or ``uint32``, element type given by ``dtype``)
or ``.npy`` (a 1-D integer array; its own dtype). Nothing is read into memory except the
windows asked for (``np.memmap`` / ``np.load(mmap_mode='r')``).

Sample ``i`` is the window ``tokens[i*S : i*S + S + 1]`` (``S`` = seq_length): consecutive
windows share one token so every token except the first is a label exactly once;
``num_samples = (n_tokens - 1) // S``. Inputs are ``window[:-1]``, labels ``window[1:]``.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

import numpy as np

from ..config.errors import ConfigError

__all__ = ["TokenFile", "open_token_array", "check_token_range"]

_BIN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
_SCAN_CHUNK = 1 << 24


def open_token_array(path: str, dtype: str = "uint16",
                     field: str = "train_dataset.data_path") -> np.ndarray:
    """Memory-map a ``.bin`` or ``.npy`` token file as a read-only 1-D array."""
    if not os.path.isfile(path):
        raise ConfigError(field, f"token file not found: {path!r}")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".bin":
        if dtype not in _BIN_DTYPES:
            raise ConfigError("train_dataset.dtype",
                              f"must be one of {sorted(_BIN_DTYPES)}, got {dtype!r}")
        np_dtype = _BIN_DTYPES[dtype]
        size = os.path.getsize(path)
        if size % np_dtype.itemsize:
            raise ConfigError(field, (f"{path!r} has {size} bytes, not a multiple of "
                                      f"{np_dtype.itemsize} ({dtype}); wrong train_dataset.dtype?"))
        if size == 0:
            raise ConfigError(field, f"{path!r} is empty")
        return np.memmap(path, dtype=np_dtype, mode="r")
    if ext == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ConfigError(field, f"{path!r} is not a readable .npy file ({exc})") from exc
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ConfigError(field, (f"{path!r} must hold a 1-D integer array, got shape "
                                      f"{arr.shape} dtype {arr.dtype}"))
        return arr
    raise ConfigError(field, f"token file must end in .bin or .npy, got {path!r}")


def check_token_range(arr: np.ndarray, vocab_size: int, where: str,
                      field: str = "train_dataset.data_path") -> None:
    """Raise unless every id is in [0, vocab_size); scans in chunks (memory-mapped input)."""
    for start in range(0, arr.shape[0], _SCAN_CHUNK):
        chunk = np.asarray(arr[start:start + _SCAN_CHUNK])
        bad = np.flatnonzero((chunk < 0) | (chunk >= vocab_size))
        if bad.size:
            pos = start + int(bad[0])
            raise ConfigError(field, (f"token id {int(chunk[bad[0]])} at position {pos} of "
                                      f"{where} is outside [0, model.vocab_size={vocab_size})"))


class TokenFile:
    """Windows of ``seq_length + 1`` tokens over a memory-mapped token stream."""

    entropy_floor = None

    def __init__(self, path: str, seq_length: int, dtype: str = "uint16",
                 vocab_size: Optional[int] = None, field: str = "train_dataset.data_path",
                 tokens: Optional[np.ndarray] = None):
        # ``tokens``: an in-memory stream (a text corpus tokenized at run time) instead of a file
        self.path = path
        self.seq_length = int(seq_length)
        self.tokens = open_token_array(path, dtype, field) if tokens is None else tokens
        n_tokens = int(self.tokens.shape[0])
        if n_tokens < self.seq_length + 1:
            raise ConfigError(field, (f"{path!r} holds {n_tokens} tokens, fewer than one sample "
                                      f"of model.seq_length + 1 = {self.seq_length + 1}"))
        self.num_samples = (n_tokens - 1) // self.seq_length
        self.vocab_size = vocab_size
        if vocab_size is not None:
            check_token_range(self.tokens, vocab_size, repr(path), field)

    def get(self, indices: Sequence[int], seq_length: Optional[int] = None) -> np.ndarray:
        """Windows ``[n, seq_length + 1]`` (int32) of samples ``indices``."""
        s = self.seq_length
        rows = [np.asarray(self.tokens[int(i) * s:int(i) * s + s + 1]) for i in indices]
        return np.stack(rows).astype(np.int32) if rows else np.zeros((0, s + 1), np.int32)
