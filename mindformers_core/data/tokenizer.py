"""Tokenizers: text <-> token ids, behind one small protocol.

``Tokenizer``: ``vocab_size``, ``eod_id`` (the end-of-document id joining documents),
``encode(text) -> int64 array``, ``decode(ids) -> str``.

* :class:`ByteTokenizer`: UTF-8 bytes (vocabulary 256, ``eod_id`` 0 = NUL);
* :class:`HFTokenizer`: a Hugging Face ``tokenizer.json`` through the optional ``tokenizers``
  package (``pip install -e .[hf]``).

``build_tokenizer(cfg)`` builds one from the ``tokenizer:`` section (None = byte);
``check_vocab_fits`` is the rule that the model can embed every id the tokenizer emits;
``check_corpus_coverage`` the rule that the tokenizer encodes the corpus into ordinary tokens
(an hf tokenizer whose vocabulary is only special tokens is refused when loaded: every text
would become end-of-document or unknown ids and training would run on no words).
"""
from __future__ import annotations

import os
from typing import Iterable, Optional, Protocol, Sequence

import numpy as np

from ..errors import ConfigError
from ..config.tokenizer import BYTE_VOCAB_SIZE, check_vocab_fits
from .text_corpus import pydoc_documents

__all__ = ["Tokenizer", "ByteTokenizer", "HFTokenizer", "build_tokenizer", "check_vocab_fits",
           "check_corpus_coverage", "load_run_tokenizer", "EOD_CANDIDATES",
           "MAX_SPECIAL_FRACTION"]

#: end-of-document tokens looked for in a tokenizer.json when ``eod_token`` is null
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "[SEP]")
#: a tokenizer mapping more of a corpus sample than this to unknown or special ids is refused
MAX_SPECIAL_FRACTION = 0.05
#: the corpus sample: up to this many documents spread over the corpus, this many characters
#: each (~128 KB: milliseconds to encode, so ``--check`` runs it too)
SAMPLE_DOCS, SAMPLE_CHARS = 64, 2000


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
    source = "byte"
    special_ids: frozenset = frozenset()   # text has no NUL: every byte is an ordinary token

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
        self.source = path
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
        # the end-of-document token is never text, even where the file does not mark it special
        self.special_ids = _special_ids(self._tok, vocab) | {self.eod_id}
        if not set(vocab.values()) - self.special_ids:
            shown = sorted(vocab, key=vocab.get)[:5]
            raise ConfigError(field, (
                f"{path!r} holds no ordinary token: its vocabulary of {len(vocab)} is only "
                f"special or unknown tokens ({', '.join(shown)}), so every text would encode "
                "to those ids and training would see no words; use a trained tokenizer.json "
                "(python -m mindformers_core.tools.train_tokenizer)"))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_batch(self, texts: Sequence[str]):
        """Encodes in parallel (the Rust side uses every core)."""
        return [np.asarray(e.ids, dtype=np.int64) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _special_ids(tok, vocab) -> frozenset:
    """The ids of a ``tokenizers.Tokenizer`` that are not text: its special added tokens and
    its model's unknown token."""
    ids = {int(i) for i, added in tok.get_added_tokens_decoder().items() if added.special}
    unk = getattr(tok.model, "unk_token", None)
    if unk is not None and unk in vocab:
        ids.add(int(vocab[unk]))
    return frozenset(ids)


def corpus_sample(docs: Sequence[str]) -> list:
    """Up to :data:`SAMPLE_DOCS` documents spread evenly over ``docs`` (the same every run),
    each cut to its first :data:`SAMPLE_CHARS` characters."""
    stride = max(1, len(docs) // SAMPLE_DOCS)
    return [d[:SAMPLE_CHARS] for d in list(docs)[::stride][:SAMPLE_DOCS] if d]


def check_corpus_coverage(tokenizer, docs: Sequence[str], field: str = "tokenizer.path") -> None:
    """Refuse ``tokenizer`` (ConfigError naming its file) when a sample of ``docs`` encodes to
    no tokens, or more than :data:`MAX_SPECIAL_FRACTION` of its ids are unknown or special."""
    special = getattr(tokenizer, "special_ids", frozenset())
    sample = corpus_sample(docs)
    if not sample:
        return
    ids = np.concatenate([np.asarray(x, np.int64).reshape(-1)
                          for x in tokenizer.encode_batch(sample)])
    source = getattr(tokenizer, "source", getattr(tokenizer, "name", "tokenizer"))
    chars = sum(len(d) for d in sample)
    if ids.size == 0:
        raise ConfigError(field, (
            f"{source!r} encodes a {chars}-character sample of the corpus into no tokens; "
            "it cannot represent this text"))
    bad = int(np.isin(ids, np.fromiter(special, np.int64, len(special))).sum()) if special else 0
    if bad > MAX_SPECIAL_FRACTION * ids.size:
        raise ConfigError(field, (
            f"{source!r} maps {bad} of {ids.size} tokens ({100.0 * bad / ids.size:.1f}%) of a "
            f"sample of the corpus to unknown or special ids (at most "
            f"{100 * MAX_SPECIAL_FRACTION:g}% allowed); it does not cover this text"))


def build_tokenizer(cfg=None) -> Tokenizer:
    """The tokenizer of a ``tokenizer:`` section (``TokenizerConfig`` or None = byte)."""
    if cfg is None or cfg.type == "byte":
        return ByteTokenizer()
    return HFTokenizer(cfg.path, cfg.eod_token)


def load_run_tokenizer(cfg) -> Optional[Tokenizer]:
    """The run's tokenizer (``config.tokenizer.run_tokenizer_config``), loaded and checked
    against ``model.vocab_size`` and, for a text corpus, against a sample of that corpus
    (:func:`check_corpus_coverage`); None when the run has no text. MindSpore-free, cheap
    (``--check`` calls it)."""
    from ..config.tokenizer import run_tokenizer_config
    tok_cfg = run_tokenizer_config(cfg)
    if tok_cfg is None:
        return None
    tok = build_tokenizer(tok_cfg)
    check_vocab_fits(cfg.model.vocab_size, tok.vocab_size,
                     tok_cfg.path if tok_cfg.type == "hf" else tok_cfg.type)
    if "PydocText" in (cfg.train_dataset.type, getattr(cfg.eval_dataset, "type", None)):
        check_corpus_coverage(tok, pydoc_documents())
    return tok
