"""The token-file sidecar: what a raw token file holds, so it is never read with the wrong dtype.

A raw ``.bin`` file is only bytes: a ``uint32`` stream read as ``uint16`` gives plausible-looking
garbage. Every token file written by ``tools/make_token_data`` gets a sidecar next to it,
``<token file>.meta.json``::

    {"format": "mindformers_core.tokens", "version": 1, "dtype": "uint16",
     "vocab_size": 256, "num_tokens": 12345, "tokenizer": "byte"}

``dtype``: element type of the file; ``vocab_size``: ids are in ``[0, vocab_size)``;
``num_tokens``: the stream length (checked against the file size); ``tokenizer``: a name or
null. :func:`read_token_meta` validates every field and raises ``ConfigError`` naming the
sidecar and the entry.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from ..errors import ConfigError

__all__ = ["META_FORMAT", "META_VERSION", "TOKEN_DTYPES", "meta_path", "write_token_meta",
           "read_token_meta"]

META_FORMAT = "mindformers_core.tokens"
META_VERSION = 1
#: element types a token file may have, with their size in bytes
TOKEN_DTYPES = {"uint8": 1, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8}
_MAX_SIDECAR_BYTES = 1 << 16


def meta_path(path: str) -> str:
    """Where the sidecar of token file ``path`` lives."""
    return path + ".meta.json"


def write_token_meta(path: str, dtype: str, vocab_size: int, num_tokens: int,
                     tokenizer: Optional[str] = None) -> str:
    """Write the sidecar of token file ``path``; returns the sidecar's path."""
    meta = {"format": META_FORMAT, "version": META_VERSION, "dtype": str(dtype),
            "vocab_size": int(vocab_size), "num_tokens": int(num_tokens),
            "tokenizer": tokenizer}
    _validate(meta, meta_path(path))
    out = meta_path(path)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return out


def read_token_meta(path: str, field: str = "train_dataset.data_path") -> Optional[dict]:
    """The validated sidecar of token file ``path``, or None when it has none."""
    side = meta_path(path)
    if not os.path.exists(side):
        return None
    try:
        if os.path.getsize(side) > _MAX_SIDECAR_BYTES:
            raise ValueError(f"larger than {_MAX_SIDECAR_BYTES} bytes")
        with open(side, "r", encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(field, f"token sidecar {side!r} is unreadable: {str(exc)[:200]}") \
            from None
    try:
        _validate(meta, side)
    except ValueError as exc:
        raise ConfigError(field, str(exc)) from None
    return meta


def _validate(meta, side: str) -> None:
    def bad(what):
        return ValueError(f"token sidecar {side!r}: {what}")

    if not isinstance(meta, dict):
        raise bad(f"must be a JSON object, got {type(meta).__name__}")
    if meta.get("format") != META_FORMAT:
        raise bad(f"format must be {META_FORMAT!r}, got {str(meta.get('format'))[:60]!r}")
    if meta.get("version") != META_VERSION:
        raise bad(f"version {str(meta.get('version'))[:20]} is not supported (this reader "
                  f"knows version {META_VERSION})")
    if meta.get("dtype") not in TOKEN_DTYPES:
        raise bad(f"dtype must be one of {sorted(TOKEN_DTYPES)}, got "
                  f"{str(meta.get('dtype'))[:40]!r}")
    for key, lo in (("vocab_size", 1), ("num_tokens", 0)):
        value = meta.get(key)
        if type(value) is not int or value < lo:
            raise bad(f"{key} must be an integer >= {lo}, got {str(value)[:40]!r}")
    if meta.get("tokenizer") is not None and not isinstance(meta["tokenizer"], str):
        raise bad("tokenizer must be a string or null")
