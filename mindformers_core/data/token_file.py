"""TokenFile: a flat stream of token ids on disk, memory-mapped, cut into training windows.

Formats: ``.bin`` (raw little-endian ids; element type from the sidecar ``<file>.meta.json``
that ``tools/make_token_data`` writes, see ``token_meta.py``, else from an explicit ``dtype``)
or ``.npy`` (a 1-D integer array; its own dtype). Nothing is read into memory except the
windows asked for (``np.memmap`` / ``np.load(mmap_mode='r')``).

Sample ``i`` is the window ``tokens[i*S : i*S + S + 1]`` (``S`` = seq_length): consecutive
windows share one token so every token except the first is a label exactly once;
``num_samples = (n_tokens - 1) // S``. Inputs are ``window[:-1]``, labels ``window[1:]``.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError
from .token_meta import meta_path, read_token_meta

__all__ = ["TokenFile", "open_token_array", "check_token_range", "check_zero_pattern"]

_CONFIG_DTYPES = ("uint16", "uint32")       # what train_dataset.dtype may name
_SCAN_CHUNK = 1 << 24
_PATTERN_SAMPLE = 1 << 16                   # tokens looked at by the zero-pattern check


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name).newbyteorder("<")


def open_token_array(path: str, dtype: Optional[str] = None,
                     field: str = "train_dataset.data_path") -> Tuple[np.ndarray, Optional[dict]]:
    """Memory-map a ``.bin`` or ``.npy`` token file as a read-only 1-D array.

    Returns ``(tokens, sidecar)``. The sidecar (``data/token_meta.py``) decides the element
    type of a ``.bin`` file; a ``dtype`` that contradicts it is an error. A ``.bin`` without a
    sidecar needs an explicit ``dtype`` and must pass :func:`check_zero_pattern`.
    """
    if not os.path.isfile(path):
        raise ConfigError(field, f"token file not found: {path!r}")
    if not os.access(path, os.R_OK):
        raise ConfigError(field, f"token file {path!r} is not readable (permissions)")
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".bin", ".npy"):
        raise ConfigError(field, f"token file must end in .bin or .npy, got {path!r}")
    meta = read_token_meta(path, field)
    if dtype is not None and dtype not in _CONFIG_DTYPES:
        raise ConfigError("train_dataset.dtype",
                          f"must be one of {sorted(_CONFIG_DTYPES)}, got {dtype!r}")
    if meta is not None and dtype is not None and dtype != meta["dtype"]:
        raise ConfigError("train_dataset.dtype", (
            f"{dtype!r} contradicts the token file's sidecar {meta_path(path)!r}, which says "
            f"{meta['dtype']!r}; remove train_dataset.dtype (the sidecar decides)"))
    if ext == ".bin":
        if meta is None and dtype is None:
            raise ConfigError("train_dataset.dtype", (
                f"{path!r} is a raw token file without a sidecar ({meta_path(path)!r}), so its "
                f"element type is unknown: set train_dataset.dtype ({' or '.join(_CONFIG_DTYPES)}) "
                "to the dtype it was written with, or rewrite it with "
                "`python -m mindformers_core.tools.make_token_data`, which writes the sidecar"))
        name = meta["dtype"] if meta is not None else dtype
        np_dtype = _np_dtype(name)
        size = os.path.getsize(path)
        if size % np_dtype.itemsize:
            raise ConfigError(field, (f"{path!r} has {size} bytes, not a multiple of "
                                      f"{np_dtype.itemsize} ({name}); wrong train_dataset.dtype?"))
        if size == 0:
            raise ConfigError(field, f"{path!r} is empty")
        arr = np.memmap(path, dtype=np_dtype, mode="r")
        if meta is None:
            check_zero_pattern(arr, name, path, field)
    else:
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ConfigError(field, f"{path!r} is not a readable .npy file ({exc})") from exc
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise ConfigError(field, (f"{path!r} must hold a 1-D integer array, got shape "
                                      f"{arr.shape} dtype {arr.dtype}"))
        if meta is not None and _np_dtype(meta["dtype"]) != arr.dtype.newbyteorder("<"):
            raise ConfigError(field, (f"{path!r} holds {arr.dtype}, its sidecar "
                                      f"{meta_path(path)!r} says {meta['dtype']}"))
    if meta is not None and meta["num_tokens"] != arr.shape[0]:
        raise ConfigError(field, (f"{path!r} holds {arr.shape[0]} tokens, its sidecar "
                                  f"{meta_path(path)!r} says {meta['num_tokens']}: the file was "
                                  "changed or cut after it was written"))
    return arr, meta


def check_zero_pattern(arr: np.ndarray, dtype: str, path: str,
                       field: str = "train_dataset.data_path") -> None:
    """A wider stream read as uint16 shows its zero high halves: every second element is 0
    while the others are not. Refuse that (a uint32 file read with ``dtype: uint16``)."""
    if dtype != "uint16":
        return
    sample = np.asarray(arr[:_PATTERN_SAMPLE - _PATTERN_SAMPLE % 2])
    if sample.size < 64:
        return
    even, odd = sample[0::2], sample[1::2]
    if not odd.any() and even.any():
        raise ConfigError("train_dataset.dtype", (
            f"{path!r} read as uint16 has 0 at every odd position of its first {sample.size} "
            "tokens: it looks like a uint32 file (high halves of the ids); set "
            "train_dataset.dtype: uint32"))


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

    def __init__(self, path: str, seq_length: int, dtype: Optional[str] = None,
                 vocab_size: Optional[int] = None, field: str = "train_dataset.data_path",
                 tokens: Optional[np.ndarray] = None):
        # ``tokens``: an in-memory stream (a text corpus tokenized at run time) instead of a file
        self.path = path
        self.seq_length = int(seq_length)
        if tokens is None:
            self.tokens, self.meta = open_token_array(path, dtype, field)
        else:
            self.tokens, self.meta = tokens, None
        if self.meta is not None and vocab_size is not None \
                and self.meta["vocab_size"] > vocab_size:
            raise ConfigError(field, (
                f"{path!r} was tokenized with a vocabulary of {self.meta['vocab_size']} "
                f"(sidecar {meta_path(path)!r}), larger than model.vocab_size={vocab_size}"))
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
