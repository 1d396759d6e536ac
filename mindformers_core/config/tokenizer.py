"""`tokenizer:` section: how text becomes token ids (text corpora, samples, generation).

* ``type: byte`` (default): one token per UTF-8 byte, vocabulary 256, end-of-document id 0
  (the NUL byte, which text does not contain).
* ``type: hf``: a Hugging Face ``tokenizer.json`` at ``path`` (needs the ``tokenizers``
  package: ``pip install -e .[hf]``); ``eod_token`` names its end-of-document token (null: the
  first of ``<|endoftext|>``, ``</s>``, ``<eos>``, ``[SEP]`` the vocabulary holds).

A model whose ``vocab_size`` is below the tokenizer's is an error naming both (checked when
the tokenizer is loaded, ``data.tokenizer.check_vocab_fits``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from ..errors import ConfigError
from .schema import Section

__all__ = ["TokenizerConfig", "run_tokenizer_config", "check_text_sections", "check_vocab_fits",
           "BYTE_VOCAB_SIZE"]


@dataclass
class TokenizerConfig(Section):
    type: Literal["byte", "hf"] = "byte"
    path: Optional[str] = None         # tokenizer.json (type hf)
    eod_token: Optional[str] = None    # type hf: end-of-document token; null = auto-detect

    def validate(self, path: str) -> None:
        if self.type == "hf" and not self.path:
            raise ConfigError(f"{path}.path", "required when type is hf (a tokenizer.json file)")
        if self.type == "byte":
            for key in ("path", "eod_token"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"{path}.{key}", "only used by type hf, not byte")


BYTE_VOCAB_SIZE = 256


def run_tokenizer_config(cfg) -> Optional[TokenizerConfig]:
    """The tokenizer a run uses: its ``tokenizer:`` section, else byte-level for a text
    corpus (``PydocText``), else None (the data are token ids already)."""
    if cfg.tokenizer is not None:
        return cfg.tokenizer
    if cfg.train_dataset.type == "PydocText":
        return TokenizerConfig()
    return None


def check_text_sections(cfg) -> None:
    """Cross-section rules of held-out data and text: evaluation needs held-out data, a
    sample needs a tokenizer, a byte-level tokenizer needs ``model.vocab_size >= 256`` (an hf
    one is checked when loaded)."""
    if cfg.eval_dataset is not None and cfg.train_dataset.validation_split > 0:
        raise ConfigError("train_dataset.validation_split", "not used when eval_dataset is set "
                                                            "(that corpus is the held-out data)")
    held_out = cfg.eval_dataset is not None or cfg.train_dataset.validation_split > 0
    if cfg.training.eval_interval is not None and not held_out:
        raise ConfigError("training.eval_interval", "needs held-out data: set eval_dataset or "
                                                    "train_dataset.validation_split")
    tok = run_tokenizer_config(cfg)
    if cfg.logging.sample_prompt is not None and tok is None:
        raise ConfigError("logging.sample_prompt", "needs a text tokenizer: set the tokenizer "
                                                   "section (type byte or hf)")
    if tok is not None and tok.type == "byte":
        check_vocab_fits(cfg.model.vocab_size, BYTE_VOCAB_SIZE, "byte")


def check_vocab_fits(model_vocab_size: int, tokenizer_vocab_size: int, source: str) -> None:
    """The model must embed every id the tokenizer emits; raises naming both sizes."""
    if int(model_vocab_size) < int(tokenizer_vocab_size):
        raise ConfigError("model.vocab_size", (
            f"{model_vocab_size} is below the vocabulary of the tokenizer ({source}: "
            f"{tokenizer_vocab_size} tokens); set model.vocab_size >= {tokenizer_vocab_size}"))
