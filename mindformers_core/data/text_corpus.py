"""Real English text that every Python installation has: the standard library's own
documentation topics (``pydoc_data.topics``, ~465 KB, the text behind ``help('with')``).

Read at run time, never copied into the repository. Each topic is one document; documents are
taken in sorted topic order, tokenized with the run's tokenizer and joined by its
end-of-document id, so the stream is the same on every machine with the same Python minor
version.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from ..errors import ConfigError

__all__ = ["pydoc_documents", "tokenize_documents", "pydoc_token_stream"]


def pydoc_documents() -> List[str]:
    """The documentation topics of this Python, in sorted topic order."""
    try:
        from pydoc_data import topics
    except ImportError:  # some distributions strip it; say so instead of a bare ImportError
        raise ConfigError("train_dataset.type", (
            "PydocText needs the standard library's pydoc_data package, which this Python "
            "lacks; use type TokenFile with a file from tools/make_token_data")) from None
    return [topics.topics[key] for key in sorted(topics.topics)]


def tokenize_documents(docs: List[str], tokenizer, eod_id: Optional[int] = None) -> np.ndarray:
    """One int64 stream: each document's ids followed by ``eod_id`` (default the tokenizer's;
    a negative id joins them without a separator)."""
    eod = tokenizer.eod_id if eod_id is None else int(eod_id)
    parts = []
    for ids in tokenizer.encode_batch(docs):
        parts.append(ids)
        if eod >= 0:
            parts.append(np.array([eod], dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def pydoc_token_stream(tokenizer) -> np.ndarray:
    """The pydoc corpus as one token stream of ``tokenizer``."""
    return tokenize_documents(pydoc_documents(), tokenizer)
