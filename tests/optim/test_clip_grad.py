"""Global norm and clipping against numpy."""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.optim.clip_grad import clip_grad_by_global_norm, global_grad_norm


def grads_np(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in [(4, 5), (7,), (2, 3, 4)]]


def test_global_norm_matches_numpy():
    gs = grads_np()
    want = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in gs))
    assert global_grad_norm([Tensor(g) for g in gs]) == pytest.approx(want, rel=1e-6)


def test_none_skipped_and_bf16_cast():
    g = np.array([3.0, 4.0], np.float32)
    assert global_grad_norm([None, Tensor(g).astype(ms.bfloat16), None]) == pytest.approx(5.0)
    assert global_grad_norm([None]) == 0.0


def test_clip_scales_when_above_and_returns_preclip_norm():
    gs = grads_np(1)
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in gs))
    out, pre = clip_grad_by_global_norm([Tensor(g) for g in gs] + [None], 1.0)
    assert pre == pytest.approx(norm, rel=1e-6)
    coef = 1.0 / (norm + 1e-6)
    for o, g in zip(out, gs):
        np.testing.assert_allclose(o.asnumpy(), g * coef, rtol=1e-6)
    assert out[-1] is None
    assert global_grad_norm(out) == pytest.approx(1.0, rel=1e-5)


def test_no_clip_below_threshold_and_none_disables():
    gs = [Tensor(g) for g in grads_np(2)]
    out, pre = clip_grad_by_global_norm(gs, 1e6)
    for o, g in zip(out, gs):
        np.testing.assert_array_equal(o.asnumpy(), g.asnumpy())
    out, pre2 = clip_grad_by_global_norm(gs, None)
    assert pre2 == pytest.approx(pre) and out[0] is gs[0]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_norm_returned_and_grads_untouched(bad):
    g = np.array([1.0, bad], np.float32)
    out, pre = clip_grad_by_global_norm([Tensor(g), Tensor(np.ones(2, np.float32))], 1.0)
    assert not math.isfinite(pre)
    np.testing.assert_array_equal(out[1].asnumpy(), np.ones(2, np.float32))


def test_max_norm_zero_zeroes_grads_like_upstream():
    out, _ = clip_grad_by_global_norm([Tensor(np.ones(3, np.float32))], 0.0)
    np.testing.assert_array_equal(out[0].asnumpy(), np.zeros(3, np.float32))


def test_norm_is_the_same_across_bucket_boundaries(monkeypatch):
    """Gradients packed into several concat buckets (one tensor larger than a bucket on its own,
    bf16 mixed in) give the numpy norm over every element."""
    import mindspore as ms
    from mindformers_core.optim import clip_grad
    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=s).astype(np.float32) for s in [(5, 3), (40,), (7,), (2, 2, 3), (9,)]]
    grads = [Tensor(a) for a in arrays]
    grads[3] = Tensor(arrays[3]).astype(ms.bfloat16)
    arrays[3] = grads[3].astype(ms.float32).asnumpy()
    ref = np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in arrays))
    monkeypatch.setattr(clip_grad, "NORM_BUCKET_NUMEL", 20)
    assert [len(b) for b in clip_grad._norm_buckets(grads)] == [1, 1, 2, 1]
    assert clip_grad.global_grad_norm(grads + [None]) == pytest.approx(ref, rel=1e-6)
