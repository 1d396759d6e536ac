"""Train a byte-level BPE tokenizer on your text files (Hugging Face ``tokenizers``).

    python -m mindformers_core.tools.train_tokenizer corpus/*.txt --vocab-size 8000 \\
        --output output/tokenizer.json

The result is a ``tokenizer.json`` for ``tokenizer: {type: hf, path: ...}`` and for
``make_token_data --tokenizer``. Byte-level pre-tokenization (GPT-2 style) means any text
encodes (no unknown token) and decoding inverts encoding exactly; ``<|endoftext|>`` is added as
the end-of-document token (id 0). Needs the ``hf`` extra: ``pip install -e .[hf]``. Training
on a few MB takes seconds: the Rust trainer uses every core.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

__all__ = ["train_bpe", "main", "EOD_TOKEN"]

EOD_TOKEN = "<|endoftext|>"


def train_bpe(files: Sequence[str], output: str, vocab_size: int = 8000,
              min_frequency: int = 2) -> str:
    """Train a byte-level BPE on ``files`` and save it to ``output``; returns ``output``."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ModuleNotFoundError:
        raise SystemExit("train_tokenizer needs the 'tokenizers' package: "
                         "pip install -e .[hf]") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), min_frequency=int(min_frequency),
                                  special_tokens=[EOD_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in files], trainer)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tok.save(str(output))
    return str(output)


def main(argv=None) -> int:
    from .make_token_data import expand_inputs, read_text
    p = argparse.ArgumentParser(prog="python -m mindformers_core.tools.train_tokenizer",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="text files or directories")
    p.add_argument("--output", required=True, help="tokenizer.json to write")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--min-frequency", type=int, default=2)
    args = p.parse_args(argv)
    if args.vocab_size < 257:
        p.error("--vocab-size must be >= 257 (256 byte symbols + <|endoftext|>)")
    try:
        files = expand_inputs(args.inputs)
        for path in files:
            read_text(path)   # the Rust trainer's own error names no file
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    train_bpe(files, args.output, args.vocab_size, args.min_frequency)
    mb = sum(os.path.getsize(f) for f in files) / 2 ** 20
    print(f"wrote {args.output}: byte-level BPE, vocab {args.vocab_size}, trained on "
          f"{len(files)} files ({mb:.1f} MB) in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
