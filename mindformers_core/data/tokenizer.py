"""Tokenizers: text <-> token ids, behind one small protocol.

``Tokenizer``: ``vocab_size``, ``eod_id`` (the end-of-document id joining documents),
``encode(text) -> int64 array``, ``decode(ids) -> str``.

* :class:`ByteTokenizer`: UTF-8 bytes (vocabulary 256, ``eod_id`` 0 = NUL);
* :class:`HFTokenizer`: a Hugging Face ``tokenizer.json`` through the optional ``tokenizers``
  package (``pip install -e .[hf]``).

``build_tokenizer(cfg)`` builds one from the ``tokenizer:`` section (None = byte);
``check_vocab_fits`` is the rule that the model can embed every id the tokenizer emits.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Protocol, Sequence

import numpy as np

from ..errors import ConfigError
from ..config.tokenizer import BYTE_VOCAB_SIZE, check_vocab_fits

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "build_tokenizer", "check_vocab_fits",
           "EOD_CANDIDATES"]

#: end-of-document tokens looked for in a tokenizer.json when ``eod_token`` is null
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")


class Tokenizer(Protocol):
    vocab_size: int
    eod_id: int

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ``encode(text) -> ids in [0, 256)``, ``decode`` inverts it."""

    vocab_size = BYTE_VOCAB_SIZE
    eod_id = 0
    name = "byte"

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)

    def encode_batch(self, texts: Sequence[str]):
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def _import_tokenizers(field: str):
    try:
        import tokenizers
    except ModuleNotFoundError:
        raise ConfigError(field, "type hf needs the 'tokenizers' package: pip install -e .[hf] "
                                 "(or pip install tokenizers)") from None
    return tokenizers


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (``tokenizers.Tokenizer.from_file``)."""

    name = "hf"

    def __init__(self, path: str, eod_token: Optional[str] = None,
                 field: str = "tokenizer.path"):
        tokenizers = _import_tokenizers(field)
        if not os.path.isfile(path):
            raise ConfigError(field, f"tokenizer file not found: {path!r}")
        try:
            self._tok = tokenizers.Tokenizer.from_file(path)
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise ConfigError(field, f"{path!r} is not a readable tokenizer.json ({exc})") from None
        self.path = path
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        vocab = self._tok.get_vocab(with_added_tokens=True)
        if eod_token is not None:
            if eod_token not in vocab:
                raise ConfigError("tokenizer.eod_token",
                                  f"{eod_token!r} is not in the vocabulary of {path!r}")
            self.eod_id = int(vocab[eod_token])
        else:
            found = [t for t in EOD_CANDIDATES if t in vocab]
            if not found:
                raise ConfigError("tokenizer.eod_token", (
                    f"{path!r} holds none of {list(EOD_CANDIDATES)}; name its end-of-document "
                    "token with tokenizer.eod_token"))
            self.eod_id = int(vocab[found[0]])

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]):
        """Encodes in parallel (the Rust side uses every core)."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def build_tokenizer(cfg=None) -> Tokenizer:
    """The tokenizer of a ``tokenizer:`` section (``TokenizerConfig`` or None = byte)."""
    if cfg is None or cfg.type == "byte":
        return ByteTokenizer()
    return HFTokenizer(cfg.path, cfg.eod_token)


def load_run_tokenizer(cfg) -> Optional[Tokenizer]:
    """The run's tokenizer (``config.tokenizer.run_tokenizer_config``), loaded and checked
    against ``model.vocab_size``; None when the run has no text."""
    from ..config.tokenizer import run_tokenizer_config
    tok_cfg = run_tokenizer_config(cfg)
    if tok_cfg is None:
        return None
    tok = build_tokenizer(tok_cfg)
    check_vocab_fits(cfg.model.vocab_size, tok.vocab_size,
                     tok_cfg.path if tok_cfg.type == "hf" else tok_cfg.type)
    return tok
