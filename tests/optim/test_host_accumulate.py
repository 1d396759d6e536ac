"""The host accumulation kernel (optim/host/accumulate.py): bit-identical to MindSpore's
per-tensor adds and to numpy's fp32 adds, never writes autodiff's gradients, returns sums in
one owned buffer that the rest of the step (norm, clip, host Adam) reads, and falls back to
MindSpore's adds per tensor or entirely."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.optim.clip_grad import clip_by_norm
from mindformers_core.optim.host.adam import host_adam_kernel
from mindformers_core.optim.host import accumulate as ha
from mindformers_core.trainer.accumulate import (accumulate_gradients, count_loss_tokens,
                                                 make_grad_fn)
from tests.trainer.tiny_lm import TinyLM

# mixed shapes: a scalar, tiny, odd-sized, matrices, a 3-D one and one past 2^16 elements
SHAPES = [(), (1,), (7,), (33, 5), (4, 3, 5), (256, 300), (17,)]


def _micro(rng, n, dtype=np.float32):
    """n micro-batches of gradients whose magnitudes span 1e-4..1e4 (so rounding matters)."""
    return [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-4, 4, s)).astype(dtype)
             for s in SHAPES] for _ in range(n)]


def _tensors(arrays):
    return [ms.Tensor(a) for a in arrays]


def _per_tensor_adds(micros):
    """Today's accumulation: one MindSpore add per tensor and micro-batch."""
    acc = None
    for grads in micros:
        acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]
    return acc


def _host_sums(micros, kernel):
    total = ha.GradientSum(kernel)
    for grads in micros:
        total.add(grads)
    return total.sums


@pytest.fixture(name="kernel")
def fixture_kernel():
    kernel = ha.host_add_kernel()
    if kernel is None:   # the trainer would fall back; this file tests the kernel itself
        pytest.skip(f"host add kernel unavailable: {ha.host_add_unavailable_reason()}")
    return kernel


@pytest.fixture(name="kernels_off")
def fixture_kernels_off(monkeypatch):
    monkeypatch.setenv("MFC_NATIVE_KERNELS", "0")
    ha.reset_host_add_kernel()
    yield
    monkeypatch.delenv("MFC_NATIVE_KERNELS")
    ha.reset_host_add_kernel()


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sums_are_bit_identical_to_per_tensor_adds_and_numpy(kernel, n):
    rng = np.random.default_rng(n)
    arrays = _micro(rng, n)
    micros = [_tensors(a) for a in arrays]
    before = [[g.asnumpy().copy() for g in grads] for grads in micros]
    host = _host_sums(micros, kernel)
    ref = _per_tensor_adds(micros)
    for j, (h, r) in enumerate(zip(host, ref)):
        expect = arrays[0][j].copy()
        for a in arrays[1:]:
            expect = np.add(expect, a[j], dtype=np.float32)
        assert h.dtype == ms.float32 and h.shape == r.shape == SHAPES[j]
        np.testing.assert_array_equal(h.asnumpy().view(np.uint32), r.asnumpy().view(np.uint32))
        np.testing.assert_array_equal(h.asnumpy().view(np.uint32), expect.view(np.uint32))
    # autodiff's gradients are only read
    for grads, saved in zip(micros, before):
        for g, b in zip(grads, saved):
            np.testing.assert_array_equal(g.asnumpy(), b)
    if n == 1:   # nothing to add: the first micro-batch's own tensors
        assert all(h is g for h, g in zip(host, micros[0]))


def test_sums_live_in_one_owned_buffer_reused_in_place(kernel):
    micros = [_tensors(a) for a in _micro(np.random.default_rng(5), 3)]
    total = ha.GradientSum(kernel)
    total.add(micros[0])
    total.add(micros[1])
    second = list(total.sums)
    addresses = [int(s.data_ptr()) for s in second]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in SHAPES]
    # consecutive slices of one fp32 buffer, none of them a gradient's storage
    assert addresses[1:] == [a + 4 * s for a, s in zip(addresses[:-1], sizes[:-1])]
    grad_addresses = {int(g.data_ptr()) for grads in micros for g in grads}
    assert not grad_addresses & set(addresses)
    total.add(micros[2])
    assert all(s is t for s, t in zip(total.sums, second))   # the third one adds in place
    assert [int(s.data_ptr()) for s in total.sums] == addresses


def test_sums_feed_clip_and_the_host_adam_kernel_like_mindspore_tensors(kernel):
    """Downstream reads the owned sums through MindSpore ops and through ``data_ptr()``
    (the host Adam kernel): same bits as with tensors MindSpore allocated."""
    micros = [_tensors(a) for a in _micro(np.random.default_rng(6), 2)]
    host = _host_sums(micros, kernel)
    plain = [ms.Tensor(h.asnumpy().copy()) for h in host]
    norm = float(np.sqrt(sum(float((h.asnumpy().astype(np.float64) ** 2).sum()) for h in host)))
    for got, want in zip(clip_by_norm(host, norm, 1.0)[0], clip_by_norm(plain, norm, 1.0)[0]):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())
    adam = host_adam_kernel()
    if adam is None:
        pytest.skip("host Adam kernel unavailable")
    results = []
    for grads in (host, plain):
        rng = np.random.default_rng(7)
        state = [[ms.Tensor((rng.standard_normal(s) * scale).astype(np.float32)) for s in SHAPES]
                 for scale in (1.0, 0.1)] + [[ms.Tensor(np.full(s, 0.01, np.float32))
                                              for s in SHAPES]]
        assert adam.step(*state, grads, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, decay=0.999)
        results.append([t.asnumpy().copy() for kind in state for t in kind])
    for got, want in zip(*results):
        np.testing.assert_array_equal(got, want)


def test_bf16_gradients_cast_to_fp32_first(kernel):
    """As the trainer does: bf16 gradients are cast to fp32, then summed."""
    arrays = _micro(np.random.default_rng(8), 3)
    micros = [[ms.Tensor(a).astype(ms.bfloat16).astype(ms.float32) for a in grads]
              for grads in arrays]
    for h, r in zip(_host_sums(micros, kernel), _per_tensor_adds(micros)):
        np.testing.assert_array_equal(h.asnumpy(), r.asnumpy())


def test_tensors_the_kernel_cannot_take_are_added_by_mindspore(kernel):
    """A strided fp32 gradient and an fp16 one fall back to MindSpore's add; the others still
    go through the kernel, into the owned buffer."""
    rng = np.random.default_rng(9)
    micros = []
    for _ in range(4):
        grads = _tensors(_micro(rng, 1)[0])
        grads.append(ms.Tensor(rng.standard_normal((6, 4)).astype(np.float32)).transpose(1, 0))
        grads.append(ms.Tensor(rng.standard_normal(9).astype(np.float16)))
        micros.append(grads)
    assert not micros[0][-2].is_contiguous()
    host = _host_sums(micros, kernel)
    ref = _per_tensor_adds(micros)
    for h, r in zip(host, ref):
        assert h.dtype == r.dtype and h.shape == r.shape
        np.testing.assert_array_equal(h.asnumpy(), r.asnumpy())
    owned = [int(h.data_ptr()) for h in host[:len(SHAPES)]]
    sizes = [int(np.prod(s, dtype=np.int64)) for s in SHAPES]
    assert owned[1:] == [a + 4 * s for a, s in zip(owned[:-1], sizes[:-1])]
    assert host[-1].dtype == ms.float16


def test_a_micro_batch_with_another_number_of_gradients_is_an_error(kernel):
    total = ha.GradientSum(kernel)
    total.add(_tensors(_micro(np.random.default_rng(10), 1)[0]))
    with pytest.raises(ValueError, match="6 gradients for 7 running sums"):
        total.add(_tensors(_micro(np.random.default_rng(11), 1)[0])[:6])


def test_kernels_off_means_no_kernel_and_mindspore_adds(kernels_off):
    assert ha.host_add_kernel() is None
    assert ha.host_add_unavailable_reason() == "MFC_NATIVE_KERNELS is off"
    micros = [_tensors(a) for a in _micro(np.random.default_rng(12), 3)]
    for h, r in zip(_host_sums(micros, ha.host_add_kernel()), _per_tensor_adds(micros)):
        np.testing.assert_array_equal(h.asnumpy(), r.asnumpy())


def _accumulate(n):
    rng = np.random.default_rng(13)
    ids = rng.integers(0, 16, (2 * n, 7))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:],
             "loss_mask": (rng.random((2 * n, 6)) > 0.2).astype(np.float32)}
    micros = [{k: v[2 * j:2 * j + 2] for k, v in batch.items()} for j in range(n)]
    model = TinyLM(seed=14, aux_coeff=0.1)
    grads, loss, aux = accumulate_gradients(make_grad_fn(model, model.trainable_params()),
                                            micros, count_loss_tokens(micros))
    return [g.asnumpy().copy() for g in grads], loss, aux


@pytest.mark.parametrize("n", [2, 4])
def test_accumulate_gradients_gives_the_bits_of_the_fallback(kernel, monkeypatch, n):
    with_kernel = _accumulate(n)
    monkeypatch.setenv("MFC_NATIVE_KERNELS", "0")
    ha.reset_host_add_kernel()
    try:
        assert ha.host_add_kernel() is None
        fallback = _accumulate(n)
    finally:
        monkeypatch.delenv("MFC_NATIVE_KERNELS")
        ha.reset_host_add_kernel()
    assert with_kernel[1:] == fallback[1:]
    for got, want in zip(with_kernel[0], fallback[0]):
        np.testing.assert_array_equal(got, want)


def test_clipping_scales_every_gradient_in_one_call_with_the_bits_of_mul(kernel, monkeypatch):
    rng = np.random.default_rng(8)
    arrays = [(rng.standard_normal(s) * 10).astype(np.float32) for s in SHAPES]
    grads = [ms.Tensor(a) for a in arrays] + [None]
    calls = []
    real = ha.HostAddKernel.scaled
    monkeypatch.setattr(ha.HostAddKernel, "scaled",
                        lambda self, t, f: calls.append(len(t)) or real(self, t, f))
    clipped, did = clip_by_norm(grads, 1e3, 1.0)
    assert did and calls == [len(grads)] and clipped[-1] is None
    coef = ms.Tensor(1.0 / (1e3 + 1e-6), ms.float32)
    for got, a in zip(clipped, arrays):
        np.testing.assert_array_equal(got.asnumpy(), (ms.Tensor(a) * coef).asnumpy())
        np.testing.assert_array_equal(got.asnumpy(), a * np.float32(1.0 / (1e3 + 1e-6)))
    assert len({c.asnumpy().__array_interface__["data"][0] - 4 * int(np.sum(
        [x.size for x in arrays[:k]])) for k, c in enumerate(clipped[:-1])}) == 1  # one buffer
    # a gradient the kernel does not take: every gradient goes through MindSpore's Mul
    mixed = [ms.Tensor(arrays[0]), ms.Tensor(arrays[1]).astype(ms.bfloat16)]
    out, _ = clip_by_norm(mixed, 1e3, 1.0)
    assert out[1].dtype == ms.bfloat16 and len(calls) == 2
    np.testing.assert_array_equal(out[0].asnumpy(), (mixed[0] * coef).asnumpy())
