"""Text files -> token files (.bin / .npy), Megatron .bin/.idx and MindRecord.

    python -m mindformers_core.tools.make_token_data corpus/*.txt --output data/corpus \\
        --format bin npy mindrecord idx --seq-length 64 [--tokenizer tokenizer.json]

Tokenizer: byte-level by default (``ByteTokenizer``: a token is one byte of the UTF-8 text, ids
0..255, vocabulary 256, so ``model.vocab_size >= 256``), or a Hugging Face ``tokenizer.json``
(``--tokenizer``, e.g. from ``tools/train_tokenizer``; needs the ``hf`` extra). Each input file
is one document; every document is followed by the separator id ``--eos-id`` (default the
tokenizer's end-of-document id: 0, the NUL byte, for bytes). ``--no-eos`` joins them without a
separator. The tool reports the tokenization speed in tokens/s.

Outputs, from prefix ``P``:
* ``P.idx`` (``idx``, with ``P.bin``): Megatron's document-indexed format (one sequence per
  document, ``data/indexed.py``), for ``type: IndexedDataset`` and for Megatron. Its ``P.bin``
  is byte for byte the raw stream of ``bin``, so one ``P.bin`` serves both readers;
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
import time
from typing import Dict, List, Sequence

import numpy as np

from ..data.token_meta import write_token_meta
from ..data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "expand_inputs", "tokenize_files", "write_token_file",
           "write_mindrecord", "main"]

_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MINDRECORD_SCHEMA = {
    "input_ids": {"type": "int32", "shape": [-1]},
    "labels": {"type": "int32", "shape": [-1]},
    "loss_mask": {"type": "float32", "shape": [-1]},
    "position_ids": {"type": "int32", "shape": [-1]},
}


def expand_inputs(paths: Sequence[str]) -> List[str]:
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
    """One int64 byte-level stream of all files (documents), each followed by ``eos_id``
    (None: no separator)."""
    docs = with_eod(encode_files(paths, ByteTokenizer()), eos_id)
    return np.concatenate(docs) if docs else np.zeros(0, np.int64)


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


_KB = 1024


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def mindrecord_sizes(num_rows: int, row_bytes: int):
    """(header size, page size) in bytes for ``num_rows`` rows of ``row_bytes``.

    MindRecord pads every page to the page size and ``FileWriter`` defaults to 32 MB pages
    and a 16 MB header, so a small file took ~50 MB. Here a page holds about 1/64 of the data
    (at least two rows, within MindRecord's [32 KB, 256 MB]) and the header stays at its
    16 KB minimum unless that many pages need more (64 bytes of page metadata each, with room).
    """
    total = int(num_rows) * int(row_bytes)
    page = max(32 * _KB, _pow2_at_least(2 * row_bytes), _pow2_at_least(max(1, total // 64)))
    page = min(page, 256 * 1024 * _KB)
    pages = 2 * (total // page + 2)            # raw and blob pages
    header = min(max(16 * _KB, _pow2_at_least(pages * 256)), 128 * 1024 * _KB)
    return header, page


def write_mindrecord(tokens: np.ndarray, path: str, seq_length: int) -> int:
    """Write ``path`` (+ ``.db``) with one row per window; returns the number of rows."""
    from mindspore.mindrecord import FileWriter
    rows = mindrecord_rows(np.asarray(tokens), seq_length)
    if not rows:
        raise ValueError(f"{tokens.size} tokens are fewer than one sample of seq_length + 1 = "
                         f"{seq_length + 1}")
    writer = FileWriter(path, shard_num=1, overwrite=True)
    header, page = mindrecord_sizes(len(rows), sum(v.nbytes for v in rows[0].values()))
    writer.set_header_size(header)
    writer.set_page_size(page)
    writer.add_schema(MINDRECORD_SCHEMA, "token_windows")
    for start in range(0, len(rows), 1024):
        writer.write_raw_data(rows[start:start + 1024])
    writer.commit()
    return len(rows)


def read_text(path: str) -> str:
    """The UTF-8 text of ``path``; a ``ValueError`` naming the file when it is not text."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                         "pass text files only") from None


def encode_files(paths: Sequence[str], tokenizer) -> List[np.ndarray]:
    """Token ids of each input file (one document each), in ``expand_inputs`` order."""
    return tokenizer.encode_batch([read_text(path) for path in expand_inputs(paths)])


def with_eod(docs: List[np.ndarray], eod_id) -> List[np.ndarray]:
    """Each document followed by ``eod_id`` (None: unchanged), as Megatron's --append-eod."""
    if eod_id is None:
        return list(docs)
    return [np.concatenate([d, np.array([eod_id], np.int64)]) for d in docs]


def load_tokenizer(path):
    """``ByteTokenizer`` for None, else the Hugging Face ``tokenizer.json`` at ``path``."""
    from ..data.tokenizer import HFTokenizer
    return ByteTokenizer() if path is None else HFTokenizer(path, field="--tokenizer")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindformers_core.tools.make_token_data",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="text files or directories")
    parser.add_argument("--output", required=True, help="output prefix (P.bin, P.npy, ...)")
    parser.add_argument("--format", nargs="+", choices=["bin", "npy", "mindrecord", "idx"],
                        default=["bin"], help="outputs to write (default: bin); idx = "
                        "Megatron's index P.idx next to P.bin")
    parser.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON",
                        help="a Hugging Face tokenizer.json (tools/train_tokenizer); "
                             "default byte-level")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="uint16",
                        help="element type of .bin/.npy (default uint16)")
    parser.add_argument("--seq-length", type=int, default=None,
                        help="model.seq_length; required for mindrecord")
    parser.add_argument("--eos-id", type=int, default=None,
                        help="document separator id (default: the tokenizer's, 0 for bytes)")
    parser.add_argument("--no-eos", action="store_true", help="no separator between documents")
    args = parser.parse_args(argv)
    if "mindrecord" in args.format and (args.seq_length is None or args.seq_length < 1):
        parser.error("--seq-length (>= 1) is required for --format mindrecord")
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        t0 = time.perf_counter()
        docs = with_eod(encode_files(args.inputs, tokenizer),
                        None if args.no_eos else
                        (tokenizer.eod_id if args.eos_id is None else args.eos_id))
        seconds = time.perf_counter() - t0
    except (FileNotFoundError, ValueError) as exc:   # ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokens = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    kind = "byte-level" if args.tokenizer is None else args.tokenizer
    print(f"{tokens.size} tokens ({kind}, vocab {tokenizer.vocab_size}) from {len(docs)} files "
          f"in {seconds:.2f}s ({tokens.size / max(seconds, 1e-9):,.0f} tokens/s)")
    if tokens.size and tokens.max() > np.iinfo(_DTYPES[args.dtype]).max:
        print(f"error: token id {int(tokens.max())} does not fit --dtype {args.dtype}; use "
              "--dtype uint32", file=sys.stderr)
        return 2
    for fmt in args.format:
        if fmt == "idx":
            from ..data.indexed import write_indexed
            prefix = write_indexed(args.output, docs, args.dtype)
            print(f"wrote {prefix}.bin / {prefix}.idx ({len(docs)} documents, {args.dtype}; "
                  f"train_dataset: {{type: IndexedDataset, data_path: {prefix}}})")
        elif fmt == "bin" and "idx" in args.format:
            # the indexed format's .bin is this same stream: give it the TokenFile sidecar too
            write_token_meta(f"{args.output}.bin", args.dtype, tokenizer.vocab_size,
                             tokens.size, kind)
        elif fmt in ("bin", "npy"):
            path = write_token_file(tokens, f"{args.output}.{fmt}", args.dtype,
                                    vocab_size=tokenizer.vocab_size, tokenizer=kind)
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
