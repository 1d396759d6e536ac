"""Autoregressive sampling from a language model: greedy, temperature, top-k and top-p.

``next_token(logits, temperature, top_k, top_p, rng)`` is the pure rule for one step (numpy):

* ``temperature == 0``: greedy, ``argmax`` (the lowest id on ties);
* else the softmax of ``logits / temperature``, restricted to the ``top_k`` most likely ids
  (0 = all) and then to the smallest set of the most likely ids whose probability reaches
  ``top_p`` (1.0 = all; the most likely id always stays), renormalised, sampled with ``rng``.

``generate(model, prompt_ids, max_new_tokens, ...)`` appends tokens one at a time from the
logits of the last position. While the sequence fits the model's ``seq_length``
(``context_length``) it decodes incrementally with a key/value cache (``models/kv_cache.py``;
``cache=False``: a full forward per token instead, same logits to rel 1e-5); past it, each
token is computed by a full forward over the last ``context_length`` tokens.

The model's ``cached_decoder(context)`` (``IncrementalDecoder``) decodes through its runner,
so the same loop serves every layout. A model whose output layer is split over
tensor-parallel ranks has no whole logits on a rank: greedy decoding asks for the next id (a
collective that combines each rank's top of its vocabulary rows, models/tp_model.py), and
sampling for the last position's whole logits (that one position's vocabulary shards
gathered), drawn with the same seeded ``rng`` on every rank, so every rank draws the same id.
The same holds through the pipeline stages (distributed/pipeline_eval.py: the last stage's
id or logits on every stage). Every rank of the group must call :func:`generate` with the
same arguments.
"""
from __future__ import annotations

from typing import Any, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Decoder", "IncrementalDecoder", "next_token", "filter_probs", "check_sampling", "generate"]


@runtime_checkable
class IncrementalDecoder(Protocol):
    """A key/value-cached decode of one sequence (models/kv_cache.py ``CachedDecoder``, the
    pipeline's distributed/pipeline_eval.py ``PipelineDecoder``): the same answers on every
    rank of the group."""

    def feed(self, input_ids) -> None:
        """Append ``input_ids`` [1, L]: the prompt, then each new token."""

    def greedy_next(self) -> int:
        """The greedy id after what was fed (the lowest on ties)."""

    def next_logits(self) -> np.ndarray:
        """The whole float32 logits ``[V]`` after what was fed."""


@runtime_checkable
class Decoder(Protocol):
    """What :func:`generate` reads of a model: ``models.language_model.GPTModel`` and the
    pipeline's forward (distributed/pipeline_eval.py ``PipelineForward``)."""

    cfg: Any

    def greedy_next(self, input_ids) -> int:
        """The greedy id after ``input_ids`` [1, S] by a full forward."""

    def next_logits(self, input_ids) -> np.ndarray:
        """The whole float32 logits ``[V]`` of the last position of ``input_ids`` [1, S]."""

    def cached_decoder(self, max_length: int) -> IncrementalDecoder: ...


def check_sampling(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> None:
    """Raise ``ValueError`` for sampling settings outside their ranges."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def filter_probs(probs: np.ndarray, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Probabilities restricted to the top-k ids, then to the top-p nucleus, renormalised."""
    probs = np.asarray(probs, np.float64)
    check_sampling(0.0, top_k, top_p)
    order = np.argsort(-probs, kind="stable")
    keep = np.zeros(probs.shape, bool)
    n = probs.size if top_k == 0 else min(int(top_k), probs.size)
    ranked = order[:n]
    if top_p < 1.0:
        cum = np.cumsum(probs[ranked]) / probs[ranked].sum()
        # the smallest prefix whose mass reaches top_p (always at least one id)
        n = int(np.searchsorted(cum, top_p, side="left")) + 1
        ranked = ranked[:n]
    keep[ranked] = True
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def next_token(logits: np.ndarray, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, rng: Optional[np.random.Generator] = None) -> int:
    """The next id from one position's logits (see the module docstring)."""
    logits = np.asarray(logits, np.float64).reshape(-1)
    check_sampling(temperature, top_k, top_p)
    if temperature == 0.0:
        return int(np.argmax(logits))
    z = logits / temperature
    z = np.exp(z - z.max())
    probs = filter_probs(z / z.sum(), top_k, top_p)
    rng = rng if rng is not None else np.random.default_rng()
    return int(rng.choice(probs.size, p=probs))


def generate(model: Decoder, prompt_ids: Sequence[int], max_new_tokens: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             context_length: Optional[int] = None, stop_id: Optional[int] = None,
             cache: bool = True) -> List[int]:
    """The ids that follow ``prompt_ids`` (at most ``max_new_tokens``; ends early at
    ``stop_id``); the module docstring says how."""
    import mindspore as ms
    check_sampling(temperature, top_k, top_p)
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty; generation needs at least one token")
    context = int(context_length or model.cfg.seq_length)
    rng = np.random.default_rng(seed)

    def choose(greedy, logits) -> int:
        if temperature == 0:
            return int(greedy())
        return next_token(logits(), temperature, top_k, top_p, rng)

    decoder = model.cached_decoder(context) if cache and len(ids) <= context else None
    out: List[int] = []
    fed = 0   # ids already in the cache
    for _ in range(int(max_new_tokens)):
        if decoder is not None and len(ids) <= context:
            decoder.feed(ms.Tensor(np.asarray(ids[fed:], np.int32)[None, :]))
            fed = len(ids)
            tok = choose(decoder.greedy_next, decoder.next_logits)
        else:
            window = ms.Tensor(np.asarray(ids[-context:], np.int32)[None, :])
            tok = choose(lambda: model.greedy_next(window), lambda: model.next_logits(window))
        ids.append(tok)
        out.append(tok)
        if stop_id is not None and tok == stop_id:
            break
    return out
