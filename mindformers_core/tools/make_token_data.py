"""Text files -> token files (.bin / .npy) and MindRecord, with a byte-level tokenizer.

    python -m mindformers_core.tools.make_token_data corpus/*.txt --output data/corpus \\
        --format bin npy mindrecord --seq-length 64

Tokenizer (``ByteTokenizer``): a token is one byte of the UTF-8 text (ids 0..255, vocabulary
256, so ``model.vocab_size >= 256``). Each input file is one document; documents are joined with
the separator id ``--eos-id`` (default 0, the NUL byte, which text files do not contain; so the
vocabulary stays 256). ``--no-eos`` joins them without a separator.

Outputs, from prefix ``P``:
* ``P.bin``: raw little-endian ``--dtype`` (uint16 default) token stream, for ``type: TokenFile``,
  with its sidecar ``P.bin.meta.json`` (dtype, vocabulary, length) that the loader checks;
* ``P.npy``: the same stream as a 1-D ``.npy`` array;
* ``P.mindrecord`` (+ ``P.mindrecord.db``): one row per window of ``seq-length + 1`` tokens
  (stride ``seq-length``, as TokenFile reads them) with columns ``input_ids`` (window[:-1]),
  ``labels`` (window[1:]), ``loss_mask`` (ones, float32) and ``position_ids`` (0..S-1), for
  ``type: MindDataset``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, Iterable, List, Sequence

import numpy as np

from ..data.token_meta import write_token_meta

__all__ = ["ByteTokenizer", "tokenize_files", "write_token_file", "write_mindrecord", "main"]

_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MINDRECORD_SCHEMA = {
    "input_ids": {"type": "int32", "shape": [-1]},
    "labels": {"type": "int32", "shape": [-1]},
    "loss_mask": {"type": "float32", "shape": [-1]},
    "position_ids": {"type": "int32", "shape": [-1]},
}


class ByteTokenizer:
    """UTF-8 bytes as tokens: ``encode(text) -> ids in [0, 256)``, ``decode`` inverts it."""

    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _expand(paths: Sequence[str]) -> List[str]:
    """Files as given; a directory contributes its files, sorted, recursively."""
    out: List[str] = []
    for path in paths:
        if os.path.isdir(path):
            for root, _dirs, files in sorted(os.walk(path)):
                out.extend(os.path.join(root, f) for f in sorted(files))
        elif os.path.isfile(path):
            out.append(path)
        else:
            raise FileNotFoundError(f"input not found: {path!r}")
    if not out:
        raise FileNotFoundError(f"no input files in {list(paths)!r}")
    return out


def tokenize_files(paths: Sequence[str], eos_id=0) -> np.ndarray:
    """One int64 token stream of all files (documents), separated by ``eos_id`` (None: none)."""
    tok = ByteTokenizer()
    parts = []
    for path in _expand(paths):
        with open(path, "r", encoding="utf-8") as handle:
            parts.append(tok.encode(handle.read()))
        if eos_id is not None:
            parts.append(np.array([eos_id], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def write_token_file(tokens: np.ndarray, path: str, dtype: str = "uint16",
                     vocab_size: int = ByteTokenizer.vocab_size, tokenizer: str = "byte") -> str:
    """Write a ``.bin`` (raw) or ``.npy`` token file and its sidecar ``path.meta.json``
    (dtype, vocabulary, length: ``data/token_meta.py``); checks ids fit ``dtype``."""
    np_dtype = _DTYPES[dtype]
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np_dtype).max):
        raise ValueError(f"token ids must fit {dtype}")
    arr = tokens.astype(np_dtype)
    if path.endswith(".npy"):
        np.save(path, arr)
    elif path.endswith(".bin"):
        arr.tofile(path)
    else:
        raise ValueError(f"token file must end in .bin or .npy, got {path!r}")
    write_token_meta(path, dtype, vocab_size, arr.size, tokenizer)
    return path


def mindrecord_rows(tokens: np.ndarray, seq_length: int) -> List[Dict[str, np.ndarray]]:
    """Rows of windows ``tokens[i*S : i*S + S + 1]`` as MindRecord column dicts."""
    n = (int(tokens.size) - 1) // seq_length
    pos = np.arange(seq_length, dtype=np.int32)
    rows = []
    for i in range(n):
        win = np.asarray(tokens[i * seq_length:i * seq_length + seq_length + 1], dtype=np.int32)
        rows.append({"input_ids": win[:-1].copy(), "labels": win[1:].copy(),
                     "loss_mask": np.ones(seq_length, np.float32), "position_ids": pos.copy()})
    return rows


def write_mindrecord(tokens: np.ndarray, path: str, seq_length: int) -> int:
    """Write ``path`` (+ ``.db``) with one row per window; returns the number of rows."""
    from mindspore.mindrecord import FileWriter
    rows = mindrecord_rows(np.asarray(tokens), seq_length)
    if not rows:
        raise ValueError(f"{tokens.size} tokens are fewer than one sample of seq_length + 1 = "
                         f"{seq_length + 1}")
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema(MINDRECORD_SCHEMA, "token_windows")
    for start in range(0, len(rows), 1024):
        writer.write_raw_data(rows[start:start + 1024])
    writer.commit()
    return len(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.make_token_data",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="text files or directories")
    parser.add_argument("--output", required=True, help="output prefix (P.bin, P.npy, ...)")
    parser.add_argument("--format", nargs="+", choices=["bin", "npy", "mindrecord"],
                        default=["bin"], help="outputs to write (default: bin)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="uint16",
                        help="element type of .bin/.npy (default uint16)")
    parser.add_argument("--seq-length", type=int, default=None,
                        help="model.seq_length; required for mindrecord")
    parser.add_argument("--eos-id", type=int, default=0, help="document separator id (default 0)")
    parser.add_argument("--no-eos", action="store_true", help="no separator between documents")
    args = parser.parse_args(argv)
    if "mindrecord" in args.format and (args.seq_length is None or args.seq_length < 1):
        parser.error("--seq-length (>= 1) is required for --format mindrecord")
    try:
        tokens = tokenize_files(args.inputs, None if args.no_eos else args.eos_id)
    except (FileNotFoundError, UnicodeDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    print(f"{tokens.size} tokens (byte-level, vocab 256) from {len(_expand(args.inputs))} files")
    for fmt in args.format:
        if fmt in ("bin", "npy"):
            path = write_token_file(tokens, f"{args.output}.{fmt}", args.dtype)
            print(f"wrote {path} ({args.dtype})")
        else:
            path = f"{args.output}.mindrecord"
            try:
                n = write_mindrecord(tokens, path, args.seq_length)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            print(f"wrote {path} ({n} rows of seq_length {args.seq_length})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
