"""SyntheticMarkov: a built-in corpus with a known, exactly computed loss floor.

The corpus is a random Markov chain of order ``k`` (1 or 2) over ``V`` tokens. A *context* is
the tuple of the last ``k`` tokens, encoded as ``c = sum_j x_{t-j} * V**j`` (newest token least
significant), so ``C = V**k`` contexts and the next context is ``(c * V + x) mod C``.

Transition of context ``c`` (row ``T[c]``, a distribution over the next token):

    T[c] = smoothing / V  +  (1 - smoothing) * sum_i w_i * onehot(y_i)

with ``branching`` distinct tokens ``y_i`` drawn uniformly and weights
``w ~ Dirichlet(concentration * 1)``. Small concentration makes each context prefer one or two
tokens (learnable), and ``smoothing > 0`` makes the chain irreducible and aperiodic, so its
stationary distribution ``pi`` over contexts is unique.

Entropy rate (nats/token), the best achievable expected loss of a model that sees the last k
tokens of a stationary sequence:

    H = sum_c pi[c] * H(T[c]),   H(p) = -sum_x p[x] ln p[x].

``pi`` is computed by squaring the transition matrix (order 1) or by power iteration on the
context chain ``pi'[r, x] = sum_a pi[a, r] T[a, r, x]`` (order 2), both in float64.

Samples: sample ``i`` is a pure function of ``(seed, i)``: its first ``k`` tokens are a context
drawn from ``pi``, the rest follow the chain, all driven by ``default_rng([seed, 1, i])``. So the
expected per-token NLL of every label position whose full context lies inside the sample equals
``H`` exactly (the first ``k - 1`` labels of a sample see a truncated context, a little above).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..errors import ConfigError

__all__ = ["SyntheticMarkov", "MAX_TABLE_ENTRIES", "entropy_nats"]

# V**(k+1) float64 entries for the transition table (and as many for its CDF): 2**24 = 128 MiB.
MAX_TABLE_ENTRIES = 2 ** 24
_POWER_TOL = 1e-14
_POWER_MAX_ITERS = 20000


def entropy_nats(p: np.ndarray) -> np.ndarray:
    """Row-wise Shannon entropy ``-sum p ln p`` (0 ln 0 = 0) of the last axis, float64."""
    p = np.asarray(p, dtype=np.float64)
    logp = np.log(np.where(p > 0, p, 1.0))
    return -(p * logp).sum(axis=-1)


def _stationary_order1(trans: np.ndarray, path: str) -> np.ndarray:
    """Stationary distribution of a row-stochastic matrix by repeated squaring (P^(2^n))."""
    power = trans.copy()
    for _ in range(60):
        nxt = power @ power
        nxt /= nxt.sum(axis=1, keepdims=True)
        if np.abs(nxt - power).max() < _POWER_TOL:
            power = nxt
            break
        power = nxt
    pi = power.mean(axis=0)
    if np.abs(pi @ trans - pi).max() > 1e-10:
        raise ConfigError(path, "the Markov chain did not converge to a stationary distribution; "
                          "raise markov_smoothing")
    return pi / pi.sum()


def _stationary_order2(trans3: np.ndarray, path: str) -> np.ndarray:
    """Stationary distribution over pairs (a, r) of the order-2 chain ``T[a, r, x]``."""
    vocab = trans3.shape[0]
    # Start from the order-1 marginal guess: uniform pairs.
    pi = np.full((vocab, vocab), 1.0 / vocab ** 2)
    for _ in range(_POWER_MAX_ITERS):
        nxt = np.einsum("ar,arx->rx", pi, trans3)
        nxt /= nxt.sum()
        if np.abs(nxt - pi).sum() < _POWER_TOL:
            return nxt.reshape(-1)
        pi = nxt
    raise ConfigError(path, "the order-2 Markov chain mixes too slowly to compute its entropy "
                      "rate; raise markov_smoothing or markov_branching")


class SyntheticMarkov:
    """A random order-``order`` Markov corpus over ``vocab_size`` tokens.

    ``get(indices, seq_length)`` returns token windows ``[len(indices), seq_length + 1]`` (int32);
    ``entropy_floor`` is the exact entropy rate in nats/token.
    """

    num_samples: Optional[int] = None   # infinite: every index is a fresh sample

    def __init__(self, vocab_size: int, order: int = 1, seed: int = 0, branching: int = 4,
                 concentration: float = 0.5, smoothing: float = 0.01,
                 path: str = "train_dataset"):
        if order not in (1, 2):
            raise ConfigError(f"{path}.markov_order", f"must be 1 or 2, got {order!r}")
        if vocab_size < 2:
            raise ConfigError(f"{path}.markov_vocab_size", f"must be >= 2, got {vocab_size!r}")
        entries = vocab_size ** (order + 1)
        if entries > MAX_TABLE_ENTRIES:
            raise ConfigError(f"{path}.markov_order", (
                f"vocab_size**(order+1) = {vocab_size}**{order + 1} = {entries} transition "
                f"entries exceeds {MAX_TABLE_ENTRIES}; lower markov_order or set "
                f"markov_vocab_size"))
        if not 1 <= branching <= vocab_size:
            raise ConfigError(f"{path}.markov_branching",
                              f"must be in [1, vocab_size={vocab_size}], got {branching!r}")
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"{path}.markov_smoothing", f"must be in (0, 1], got {smoothing!r}")
        if not concentration > 0.0:
            raise ConfigError(f"{path}.markov_concentration", f"must be > 0, got {concentration!r}")
        self.vocab_size = int(vocab_size)
        self.order = int(order)
        self.seed = int(seed)
        self.num_contexts = self.vocab_size ** self.order
        self.transition = self._build_transition(branching, concentration, smoothing)
        self._cdf = np.cumsum(self.transition, axis=1)
        if self.order == 1:
            self.stationary = _stationary_order1(self.transition, f"{path}.markov_smoothing")
        else:
            self.stationary = _stationary_order2(
                self.transition.reshape(self.vocab_size, self.vocab_size, self.vocab_size),
                f"{path}.markov_smoothing")
        self._stationary_cdf = np.cumsum(self.stationary)
        self.context_entropy = entropy_nats(self.transition)
        self.entropy_floor = float(self.stationary @ self.context_entropy)

    def _build_transition(self, branching: int, concentration: float,
                          smoothing: float) -> np.ndarray:
        rng = np.random.default_rng([self.seed])
        ctx, vocab = self.num_contexts, self.vocab_size
        # `branching` distinct next tokens per context: the smallest keys of a random row.
        keys = rng.random((ctx, vocab))
        choices = np.argpartition(keys, branching - 1, axis=1)[:, :branching]
        weights = rng.dirichlet(np.full(branching, float(concentration)), size=ctx)
        trans = np.full((ctx, vocab), smoothing / vocab)
        np.add.at(trans, (np.arange(ctx)[:, None], choices), (1.0 - smoothing) * weights)
        return trans / trans.sum(axis=1, keepdims=True)

    # -- sampling ----------------------------------------------------------------------------
    def context_tokens(self, contexts: np.ndarray) -> np.ndarray:
        """Decode context ids into their ``order`` tokens, oldest first: ``[n, order]``."""
        contexts = np.asarray(contexts, dtype=np.int64)
        digits = [(contexts // self.vocab_size ** j) % self.vocab_size
                  for j in range(self.order - 1, -1, -1)]
        return np.stack(digits, axis=1)

    def get(self, indices: Sequence[int], seq_length: int) -> np.ndarray:
        """Token windows ``[n, seq_length + 1]`` (int32) of samples ``indices`` (pure in index)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        length = int(seq_length) + 1
        n_steps = max(length - self.order, 0)
        uniforms = np.empty((indices.size, 1 + n_steps))
        for row, idx in enumerate(indices):
            uniforms[row] = np.random.default_rng([self.seed, 1, int(idx)]).random(1 + n_steps)
        ctx = np.searchsorted(self._stationary_cdf, uniforms[:, 0], side="right")
        ctx = np.minimum(ctx, self.num_contexts - 1)
        tokens = np.empty((indices.size, self.order + n_steps), dtype=np.int64)
        tokens[:, :self.order] = self.context_tokens(ctx)
        # Next token = how many cdf entries of the context are <= u: a binary search of the
        # row (the cdf rows strictly increase: every transition probability is > 0). Row by
        # row with scalars, because the numpy calls over a [rows, vocab] gather per step
        # cost 2-4x more for the few rows of a micro-batch (measured).
        cdf, vocab, contexts = self._cdf, self.vocab_size, self.num_contexts
        for row in range(indices.size):
            c, out = int(ctx[row]), tokens[row]
            for t, u in enumerate(uniforms[row, 1:].tolist()):
                nxt = min(int(cdf[c].searchsorted(u, side="right")), vocab - 1)  # u > cdf[-1]
                out[self.order + t] = nxt
                c = (c * vocab + nxt) % contexts
        return tokens[:, :length].astype(np.int32)

    def token_nll(self, tokens: np.ndarray) -> np.ndarray:
        """Per-token NLL (nats) under the true chain of tokens ``order..`` of each row:
        ``[n, L - order]``; used to check ``entropy_floor`` empirically."""
        tokens = np.asarray(tokens, dtype=np.int64)
        ctx = np.zeros(tokens.shape[0], dtype=np.int64)
        for j in range(self.order):
            ctx = ctx * self.vocab_size + tokens[:, j]
        out = np.empty((tokens.shape[0], tokens.shape[1] - self.order))
        for t in range(self.order, tokens.shape[1]):
            out[:, t - self.order] = -np.log(self.transition[ctx, tokens[:, t]])
            ctx = (ctx * self.vocab_size + tokens[:, t]) % self.num_contexts
        return out
