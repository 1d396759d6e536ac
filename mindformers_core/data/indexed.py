"""Megatron-LM's document-indexed dataset format (``.bin`` + ``.idx``), read and written.

So corpora preprocessed for Megatron (``tools/preprocess_data.py``) train here unchanged, and
``tools/make_token_data --format idx`` writes files Megatron reads.

``P.bin``: the token ids of every sequence, back to back, little-endian, element type from the
index. ``P.idx`` (all little-endian):

====================  ======================================================================
bytes                 content
====================  ======================================================================
9                     magic ``b"MMIDIDX\\x00\\x00"``
8 (uint64)            version, 1
1 (uint8)             dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
                      7 float32, 8 uint16
8 (uint64)            sequence count ``S``
8 (uint64)            document-index count ``D`` (documents + 1)
4 * S (int32)         tokens per sequence
8 * S (int64)         byte offset of each sequence in ``P.bin``
8 * D (int64)         document boundaries: document ``d`` is sequences
                      ``[doc[d], doc[d + 1])``; ``doc[0] = 0``, ``doc[-1] = S``
====================  ======================================================================

(Multimodal indexes append one int8 mode per sequence; they are not text and are refused by
the size check.) Training reads the ``.bin`` as one token stream (sequences are contiguous, as
every Megatron writer lays them out) cut into windows like a ``TokenFile``; document
boundaries show in the data through the end-of-document tokens the preprocessing appended
(``--append-eod``), which ``train_dataset.eod_mask_loss`` uses.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["INDEX_MAGIC", "DTYPE_CODES", "IndexInfo", "read_index", "write_indexed",
           "open_indexed_tokens", "indexed_prefix"]

INDEX_MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
               7: np.float32, 8: np.uint16}
_TOKEN_CODES = (1, 2, 3, 4, 5, 8)
_HEADER = len(INDEX_MAGIC) + 8 + 1 + 8 + 8


@dataclass
class IndexInfo:
    dtype: np.dtype
    sequence_lengths: np.ndarray     # int32 [S]
    sequence_pointers: np.ndarray    # int64 [S], bytes
    document_indices: np.ndarray     # int64 [D]

    @property
    def num_tokens(self) -> int:
        return int(self.sequence_lengths.astype(np.int64).sum())

    @property
    def num_documents(self) -> int:
        return int(self.document_indices.size) - 1


def indexed_prefix(path: str) -> str:
    """``P`` of ``P``, ``P.bin`` or ``P.idx``."""
    for ext in (".bin", ".idx"):
        if path.endswith(ext):
            return path[:-len(ext)]
    return path


def read_index(idx_path: str, field: str = "train_dataset.data_path") -> IndexInfo:
    """Parse a ``.idx`` file (raises ``ConfigError`` naming ``field`` for a broken one)."""
    if not os.path.isfile(idx_path):
        raise ConfigError(field, f"index file not found: {idx_path!r}")
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as fh:
        head = fh.read(_HEADER)
    if len(head) < _HEADER or head[:len(INDEX_MAGIC)] != INDEX_MAGIC:
        raise ConfigError(field, f"{idx_path!r} is not a Megatron .idx file (bad magic)")
    off = len(INDEX_MAGIC)
    (version,) = struct.unpack("<Q", head[off:off + 8])
    (code,) = struct.unpack("<B", head[off + 8:off + 9])
    seq_count, doc_count = struct.unpack("<QQ", head[off + 9:off + 25])
    if version != 1:
        raise ConfigError(field, f"{idx_path!r}: index version {version}, only 1 is known")
    if code not in _TOKEN_CODES:
        raise ConfigError(field, (f"{idx_path!r}: dtype code {code} is not an integer token "
                                  f"type (known: {sorted(_TOKEN_CODES)})"))
    want = _HEADER + 4 * seq_count + 8 * seq_count + 8 * doc_count
    if size != want:
        raise ConfigError(field, (f"{idx_path!r} has {size} bytes, its header implies {want} "
                                  "(truncated, or a multimodal index)"))
    lengths = np.memmap(idx_path, np.int32, "r", _HEADER, (seq_count,))
    pointers = np.memmap(idx_path, np.int64, "r", _HEADER + 4 * seq_count, (seq_count,))
    docs = np.memmap(idx_path, np.int64, "r", _HEADER + 12 * seq_count, (doc_count,))
    return IndexInfo(np.dtype(DTYPE_CODES[code]).newbyteorder("<"), np.asarray(lengths),
                     np.asarray(pointers), np.asarray(docs))


def _dtype_code(dtype) -> int:
    dtype = np.dtype(dtype)
    for code, tp in DTYPE_CODES.items():
        if np.dtype(tp) == dtype and code in _TOKEN_CODES:
            return code
    raise ValueError(f"no Megatron dtype code for {dtype}")


def write_indexed(prefix: str, documents: Iterable[Sequence[int]], dtype="uint16") -> str:
    """Write ``prefix.bin`` / ``prefix.idx`` with one sequence per document; returns prefix."""
    np_dtype = np.dtype(dtype).newbyteorder("<")
    code = _dtype_code(np_dtype)
    info = np.iinfo(np_dtype)
    lengths = []
    with open(prefix + ".bin", "wb") as fh:
        for doc in documents:
            arr = np.asarray(doc)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                raise ValueError(f"token ids must fit {np_dtype.name}")
            fh.write(arr.astype(np_dtype).tobytes(order="C"))
            lengths.append(int(arr.size))
    lengths_arr = np.asarray(lengths, np.int32)
    pointers = np.zeros(len(lengths), np.int64)
    if len(lengths) > 1:
        pointers[1:] = np.cumsum(lengths_arr[:-1].astype(np.int64)) * np_dtype.itemsize
    doc_idx = np.arange(len(lengths) + 1, dtype=np.int64)
    with open(prefix + ".idx", "wb") as fh:
        fh.write(INDEX_MAGIC)
        fh.write(struct.pack("<Q", 1))
        fh.write(struct.pack("<B", code))
        fh.write(struct.pack("<QQ", len(lengths), doc_idx.size))
        fh.write(lengths_arr.astype("<i4").tobytes())
        fh.write(pointers.astype("<i8").tobytes())
        fh.write(doc_idx.astype("<i8").tobytes())
    return prefix


def open_indexed_tokens(path: str, field: str = "train_dataset.data_path"):
    """(memory-mapped token stream of ``P.bin``, its ``IndexInfo``)."""
    prefix = indexed_prefix(path)
    info = read_index(prefix + ".idx", field)
    bin_path = prefix + ".bin"
    if not os.path.isfile(bin_path):
        raise ConfigError(field, f"data file not found: {bin_path!r}")
    itemsize = info.dtype.itemsize
    contiguous = np.zeros_like(info.sequence_pointers)
    if info.sequence_lengths.size > 1:
        contiguous[1:] = np.cumsum(info.sequence_lengths[:-1].astype(np.int64)) * itemsize
    if not np.array_equal(contiguous, info.sequence_pointers):
        raise ConfigError(field, f"{prefix!r}: sequences are not stored back to back")
    want = info.num_tokens * itemsize
    if os.path.getsize(bin_path) != want:
        raise ConfigError(field, (f"{bin_path!r} has {os.path.getsize(bin_path)} bytes, the "
                                  f"index describes {want}"))
    if want == 0:
        raise ConfigError(field, f"{prefix!r} holds no tokens")
    return np.memmap(bin_path, info.dtype, "r", 0, (info.num_tokens,)), info
