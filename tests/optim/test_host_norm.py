"""The host sum of squares (optim/host/norm.py, host_norm.c) behind global_grad_norm."""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindformers_core.optim.host import norm as host_norm
from mindformers_core.optim.clip_grad import global_grad_norm
from mindformers_core.optim.host.norm import host_sq_norm

SHAPES = [(3, 5), (host_norm.BLOCK * 2 + 3,), (1,), (0,), (129, 257)]


def grads(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]


def available():
    if host_sq_norm([Tensor(np.ones(2, np.float32))]) is None:
        pytest.skip("host kernels unavailable on this machine")


def test_equals_the_float64_sum_and_ignores_none_and_empty():
    available()
    arrays = grads()
    got = host_sq_norm([Tensor(a) for a in arrays] + [None])
    want = sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays)
    assert got == pytest.approx(want, rel=1e-13)
    assert host_sq_norm([None, Tensor(np.zeros(0, np.float32))]) == 0.0


def test_the_thread_split_does_not_change_a_bit(monkeypatch):
    available()
    monkeypatch.setattr(host_norm, "THREADED_MIN_NUMEL", 1)
    tensors = [Tensor(a) for a in grads(1, 1e3)]
    one = host_sq_norm(tensors, threads=1)
    assert all(host_sq_norm(tensors, threads=k) == one for k in (2, 3, 7))


def test_non_finite_gradients_give_a_non_finite_norm():
    available()
    a = grads(2)
    a[1][5] = np.inf
    assert math.isinf(global_grad_norm([Tensor(x) for x in a]))
    a[1][6] = np.nan
    assert math.isnan(global_grad_norm([Tensor(x) for x in a]))


def test_declines_what_is_not_a_contiguous_fp32_host_tensor():
    available()
    g = Tensor(np.ones((4, 6), np.float32))
    assert host_sq_norm([g, g.astype(ms.bfloat16)]) is None
    assert host_sq_norm([g.swapaxes(0, 1)]) is None


def test_global_grad_norm_agrees_with_the_mindspore_norm(monkeypatch):
    available()
    arrays = grads(3)
    host = global_grad_norm([Tensor(a) for a in arrays])
    mixed = global_grad_norm([Tensor(a) for a in arrays] + [Tensor(arrays[0]).astype(ms.bfloat16)])
    monkeypatch.setenv("MFC_NATIVE_KERNELS", "0")
    host_norm.reset_host_norm()
    try:
        assert host_sq_norm([Tensor(arrays[0])]) is None
        plain = global_grad_norm([Tensor(a) for a in arrays])
    finally:
        monkeypatch.delenv("MFC_NATIVE_KERNELS")
        host_norm.reset_host_norm()
    want = math.sqrt(sum(float(np.sum(a.astype(np.float64) ** 2)) for a in arrays))
    assert host == pytest.approx(want, rel=1e-14)
    assert plain == pytest.approx(want, rel=1e-6)
    bf16 = Tensor(arrays[0]).astype(ms.bfloat16).astype(ms.float32).asnumpy().astype(np.float64)
    assert mixed == pytest.approx(math.sqrt(want ** 2 + float(np.sum(bf16 ** 2))), rel=1e-6)
