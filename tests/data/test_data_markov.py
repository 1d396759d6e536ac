"""SyntheticMarkov: exact entropy rate (closed forms), empirical NLL, determinism, errors."""
import math

import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.data import SyntheticMarkov


def _h(p):
    return -sum(x * math.log(x) for x in p if x > 0)


def test_two_state_chain_matches_closed_form():
    m = SyntheticMarkov(2, order=1, seed=7, branching=2, concentration=0.3, smoothing=0.05)
    a, b = m.transition[0, 1], m.transition[1, 0]
    # Two-state chain: pi = (b, a) / (a + b); H = pi0 h(a) + pi1 h(b).
    pi0, pi1 = b / (a + b), a / (a + b)
    expected = pi0 * _h([a, 1 - a]) + pi1 * _h([b, 1 - b])
    assert m.entropy_floor == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(m.stationary, [pi0, pi1], rtol=1e-12)


def test_order2_matches_explicit_pair_chain_eigenvector():
    v = 3
    m = SyntheticMarkov(v, order=2, seed=11, branching=2, concentration=0.5, smoothing=0.02)
    # Explicit chain on pairs (a, r) -> (r, x) with probability T[(a, r), x].
    big = np.zeros((v * v, v * v))
    for a in range(v):
        for r in range(v):
            for x in range(v):
                big[a * v + r, r * v + x] = m.transition[a * v + r, x]
    vals, vecs = np.linalg.eig(big.T)
    pi = np.real(vecs[:, np.argmin(np.abs(vals - 1))])
    pi = pi / pi.sum()
    expected = sum(pi[c] * _h(m.transition[c]) for c in range(v * v))
    assert m.entropy_floor == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("vocab,order", [(32, 1), (8, 2)])
def test_empirical_nll_matches_entropy_floor(vocab, order):
    m = SyntheticMarkov(vocab, order=order, seed=3)
    tokens = m.get(np.arange(400), seq_length=64)
    per_sample = m.token_nll(tokens).mean(axis=1)       # i.i.d. across samples
    se = per_sample.std(ddof=1) / math.sqrt(per_sample.size)
    assert abs(per_sample.mean() - m.entropy_floor) < 4 * se
    assert se < 0.05 * m.entropy_floor                  # the check has power


def test_default_corpus_is_learnable():
    m = SyntheticMarkov(256, order=1, seed=0)
    assert 0.3 < m.entropy_floor < 0.4 * math.log(256)
    assert m.get([0], 8).max() < 256


def test_samples_are_pure_functions_of_index():
    m = SyntheticMarkov(64, order=2, seed=5)
    both = m.get([17, 3], 32)
    np.testing.assert_array_equal(both[0], m.get([17], 32)[0])
    np.testing.assert_array_equal(both[1], SyntheticMarkov(64, 2, seed=5).get([3], 32)[0])
    assert both.shape == (2, 33) and both.dtype == np.int32
    assert not np.array_equal(both, SyntheticMarkov(64, 2, seed=6).get([17, 3], 32))
    assert not np.array_equal(both[0], both[1])


@pytest.mark.parametrize("kwargs,field,msg", [
    (dict(vocab_size=8, order=3), "train_dataset.markov_order", "must be 1 or 2"),
    (dict(vocab_size=5000, order=1), "train_dataset.markov_order", "exceeds 16777216"),
    (dict(vocab_size=8, branching=9), "train_dataset.markov_branching", r"\[1, vocab_size=8\]"),
    (dict(vocab_size=8, smoothing=0.0), "train_dataset.markov_smoothing", r"\(0, 1\]"),
    (dict(vocab_size=8, concentration=0.0), "train_dataset.markov_concentration", "> 0"),
    (dict(vocab_size=1), "train_dataset.markov_vocab_size", ">= 2"),
])
def test_errors(kwargs, field, msg):
    with pytest.raises(ConfigError, match=f"^{field}: .*{msg}"):
        SyntheticMarkov(**kwargs)


def test_order2_chain_that_does_not_mix_is_reported():
    # One next token per context and almost no smoothing: the pair chain is a near-permutation
    # whose cycles never mix within the iteration budget.
    with pytest.raises(ConfigError, match="^train_dataset.markov_smoothing: the order-2 Markov "
                                          "chain mixes too slowly"):
        SyntheticMarkov(4, order=2, seed=1, branching=1, smoothing=1e-12)


def test_bigram_counts_learn_down_to_the_floor():
    # The ideal order-1 "model" (smoothed bigram counts on 300 training samples) reaches the
    # floor on held-out samples: the corpus is learnable far below ln(V).
    vocab = 32
    m = SyntheticMarkov(vocab, order=1, seed=2)
    train = m.get(np.arange(300), 64).astype(np.int64)
    counts = np.full((vocab, vocab), 0.05)
    np.add.at(counts, (train[:, :-1].ravel(), train[:, 1:].ravel()), 1.0)
    probs = counts / counts.sum(axis=1, keepdims=True)
    held = m.get(np.arange(10_000, 10_200), 64).astype(np.int64)
    nll = -np.log(probs[held[:, :-1], held[:, 1:]]).mean()
    assert abs(nll - m.entropy_floor) < 0.15         # sampling noise of 12800 tokens ~0.03
    assert nll < 0.4 * math.log(vocab)


def _reference_tokens(src, indices, seq_length):
    """The chain sampled with whole-row numpy comparisons (count of cdf entries <= u): the
    definition the row-by-row binary search in ``SyntheticMarkov.get`` must reproduce."""
    indices = np.asarray(indices, dtype=np.int64)
    n_steps = seq_length + 1 - src.order
    u = np.stack([np.random.default_rng([src.seed, 1, int(i)]).random(1 + n_steps)
                  for i in indices])
    ctx = np.minimum(np.searchsorted(src._stationary_cdf, u[:, 0], side="right"),
                     src.num_contexts - 1)
    tokens = [src.context_tokens(ctx)]
    for t in range(n_steps):
        nxt = np.minimum((src._cdf[ctx] <= u[:, 1 + t, None]).sum(axis=1), src.vocab_size - 1)
        tokens.append(nxt[:, None])
        ctx = (ctx * src.vocab_size + nxt) % src.num_contexts
    return np.concatenate(tokens, axis=1)[:, :seq_length + 1].astype(np.int32)


@pytest.mark.parametrize("vocab, order, seed", [(7, 1, 0), (64, 2, 3), (300, 1, 11)])
def test_samples_equal_the_whole_row_comparison_definition(vocab, order, seed):
    src = SyntheticMarkov(vocab, order=order, seed=seed, branching=min(4, vocab))
    idx = [0, 5, 17, 123456]
    np.testing.assert_array_equal(src.get(idx, 33), _reference_tokens(src, idx, 33))
