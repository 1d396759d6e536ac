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

A model whose output layer is split over tensor-parallel ranks (``model.vocab_parallel``) has
no whole logits: greedy decoding asks it for the next id (``model.greedy_next``, a
collective that combines each rank's top of its vocabulary rows, models/tp_model.py), and
sampling for the last position's whole logits (``model.next_logits``: that one position's
vocabulary shards gathered), drawn with the same seeded ``rng`` on every rank, so every rank
draws the same id; a full forward over the last ``context_length`` tokens per token (no
key/value cache there). The same holds through the pipeline stages
(distributed/pipeline_eval.py: the last stage's logits on every stage). Every rank of the
group must call :func:`generate` with the same arguments.
"""
from __future__ import annotations

from typing import Any, List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Decoder", "next_token", "filter_probs", "check_sampling", "generate"]


@runtime_checkable
class Decoder(Protocol):
    """What :func:`generate` reads of a model: ``models.language_model.GPTModel`` (its
    ``logits`` and key/value cache when ``vocab_parallel`` is False) and the pipeline's
    forward (distributed/pipeline_eval.py ``PipelineForward``, always vocabulary-parallel)."""

    cfg: Any

    @property
    def vocab_parallel(self) -> bool:
        """Whether no rank has whole logits: decode through :meth:`greedy_next` /
        :meth:`next_logits` (collectives of the ranks that hold the shards)."""

    def greedy_next(self, input_ids) -> int: ...

    def next_logits(self, input_ids) -> np.ndarray: ...


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
    ``stop_id``). ``model.logits(ids [1, T]) -> [1, T, V]``."""
    import mindspore as ms
    check_sampling(temperature, top_k, top_p)
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty; generation needs at least one token")
    context = int(context_length or model.cfg.seq_length)
    rng = np.random.default_rng(seed)
    if model.vocab_parallel:
        return _next_ids_parallel(model, ids, int(max_new_tokens), context, stop_id,
                                  lambda window: model.greedy_next(window) if temperature == 0
                                  else next_token(model.next_logits(window), temperature,
                                                  top_k, top_p, rng))
    out: List[int] = []
    decoder = None
    if cache and len(ids) <= context:
        from .kv_cache import CachedDecoder
        decoder = CachedDecoder(model, context)
    fed = 0   # ids already in the cache
    for _ in range(int(max_new_tokens)):
        if decoder is not None and len(ids) <= context:
            new = ms.Tensor(np.asarray(ids[fed:], np.int32)[None, :])
            logits = (decoder.prefill(new) if fed == 0 else decoder.step(new)).asnumpy()[0, -1]
            fed = len(ids)
        else:
            window = np.asarray(ids[-context:], np.int32)[None, :]
            logits = model.logits(ms.Tensor(window)).asnumpy()[0, -1]
        tok = next_token(logits, temperature, top_k, top_p, rng)
        ids.append(tok)
        out.append(tok)
        if stop_id is not None and tok == stop_id:
            break
    return out


def _next_ids_parallel(model, ids: List[int], max_new_tokens: int, context: int,
                       stop_id: Optional[int], next_id) -> List[int]:
    """Ids from a model without whole logits on one rank (module docstring): ``next_id`` of
    the last ``context`` ids per token, a full forward each."""
    import mindspore as ms
    out: List[int] = []
    for _ in range(max_new_tokens):
        tok = int(next_id(ms.Tensor(np.asarray(ids[-context:], np.int32)[None, :])))
        ids.append(tok)
        out.append(tok)
        if stop_id is not None and tok == stop_id:
            break
    return out
