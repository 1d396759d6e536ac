"""Token-weighted accumulation: 4 micro-batches of 2 with unequal token counts give the same
gradients as one batch of 8 (relative 1e-5), and a numpy finite-difference-free reference."""
import numpy as np
import pytest

from mindformers_core.trainer.accumulate import (accumulate_gradients, count_loss_tokens,
                                                 make_grad_fn)
from tests.trainer.tiny_lm import TinyLM


def _batch(rng, b, s, vocab):
    ids = rng.integers(0, vocab, (b, s + 1))
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:],
            "loss_mask": np.ones((b, s), np.float32)}


def _split(big, n):
    return [{k: v[i * (len(v) // n):(i + 1) * (len(v) // n)] for k, v in big.items()}
            for i in range(n)]


@pytest.mark.parametrize("aux_coeff", [0.0])
def test_four_micro_batches_equal_one_big_batch_with_unequal_tokens(aux_coeff):
    rng = np.random.default_rng(0)
    big = _batch(rng, 8, 6, 16)
    # unequal token counts per micro-batch: mask out different amounts of each pair of rows
    big["loss_mask"][0, :5] = 0     # micro 0: 12 - 5 = 7 tokens
    big["loss_mask"][2:4, 1:] = 0   # micro 1: 2 tokens
    big["loss_mask"][7, 3:] = 0     # micro 3: 9 tokens; micro 2: 12 tokens
    micros = _split(big, 4)
    counts = [m["loss_mask"].sum() for m in micros]
    assert len(set(counts)) == 4, counts

    model = TinyLM(seed=1, aux_coeff=aux_coeff)
    params = model.trainable_params()
    fn = make_grad_fn(model, params)
    g_big, loss_big, _ = accumulate_gradients(fn, [big], count_loss_tokens([big]))
    g_acc, loss_acc, _ = accumulate_gradients(fn, micros, count_loss_tokens(micros))
    assert loss_acc == pytest.approx(loss_big, rel=1e-6)
    for a, b in zip(g_acc, g_big):
        a, b = a.asnumpy(), b.asnumpy()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * np.abs(b).max())

    # Upstream's per-micro-batch mean / N differs here: the bias this design removes.
    per_micro = [accumulate_gradients(fn, [m], count_loss_tokens([m]))[0] for m in micros]
    upstream = [sum(g[i].asnumpy() for g in per_micro) / 4 for i in range(len(params))]
    assert max(np.abs(u - b.asnumpy()).max() for u, b in zip(upstream, g_big)) > 1e-3


def test_gradient_matches_numpy_reference_for_the_head():
    """d(sum nll / T)/d head = h^T (softmax - onehot) masked / T, computed in numpy."""
    rng = np.random.default_rng(3)
    batch = _batch(rng, 2, 5, 16)
    batch["loss_mask"][1, 2:] = 0
    model = TinyLM(seed=2)
    params = model.trainable_params()
    grads, loss_sum, _ = accumulate_gradients(make_grad_fn(model, params), [batch],
                                              count_loss_tokens([batch]))
    emb, fc, bias, head = (p.asnumpy().astype(np.float64) for p in params)
    h = np.tanh(emb[batch["input_ids"]] @ fc + bias)
    logits = h @ head
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(16)[batch["labels"]]
    mask = batch["loss_mask"][..., None]
    T = mask.sum()
    ref = np.einsum("bsh,bsv->hv", h, (p - onehot) * mask) / T
    np.testing.assert_allclose(grads[3].asnumpy(), ref, rtol=1e-4, atol=1e-7)
    ref_loss = -(np.log(p) * onehot * mask).sum()
    assert loss_sum == pytest.approx(ref_loss, rel=1e-5)


def test_aux_loss_is_averaged_over_micro_batches():
    rng = np.random.default_rng(4)
    big = _batch(rng, 4, 4, 16)
    model = TinyLM(seed=5, aux_coeff=0.5)
    fn = make_grad_fn(model, model.trainable_params())
    _, _, aux_one = accumulate_gradients(fn, [big], count_loss_tokens([big]))
    micros = _split(big, 2)
    _, _, aux_two = accumulate_gradients(fn, micros, count_loss_tokens(micros))
    # mean(h^2) of equal-size halves averages to the mean over the whole batch
    assert aux_two == pytest.approx(aux_one, rel=1e-5)
    assert aux_one > 0


def test_no_loss_tokens_is_an_error():
    rng = np.random.default_rng(6)
    b = _batch(rng, 1, 3, 16)
    b["loss_mask"][:] = 0
    model = TinyLM()
    with pytest.raises(ValueError, match="no loss tokens"):
        accumulate_gradients(make_grad_fn(model, model.trainable_params()), [b], 0.0)


def test_aux_gradient_is_a_mean_over_data_parallel_ranks():
    """Under data parallel the ranks' gradients are SUMMED, so each rank weights its aux loss by
    1/(N*dp): two ranks holding the same micro-batch then sum to the single-rank aux gradient."""
    rng = np.random.default_rng(7)
    b = _batch(rng, 2, 4, 16)
    b["loss_mask"][:] = 0
    b["loss_mask"][0, 0] = 1  # one token so the step is valid; its CE gradient is shared below
    model = TinyLM(seed=8, aux_coeff=0.5)
    fn = make_grad_fn(model, model.trainable_params())
    tokens = count_loss_tokens([b])
    g1, _, _ = accumulate_gradients(fn, [b], tokens)
    g2, _, _ = accumulate_gradients(fn, [b], 2 * tokens, data_parallel=2)
    # rank-sum of two identical ranks' grads == single-rank grad (CE over 2x tokens, aux / 2)
    for a, c in zip(g1, g2):
        np.testing.assert_allclose(2 * c.asnumpy(), a.asnumpy(), rtol=1e-5, atol=1e-7)
