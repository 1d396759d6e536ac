"""Newton-Schulz orthogonalisation: spectrum, polar factor, layouts, schedules, scale modes."""
import math

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from _muon_numpy_reference import newton_schulz

from mindformers_core.optim.newton_schulz import (
    DEFAULT_NS_COEFFICIENTS, configure_ns_precision, default_ns_dtype, muon_scale_factor,
    normalize_ns_schedule, ns_matmul_flops, orthogonalize, preset_schedule)

FLAT5 = normalize_ns_schedule(list(DEFAULT_NS_COEFFICIENTS), 5)


def _svals(y):
    return np.linalg.svd(np.asarray(y, np.float64), compute_uv=False)


def _numpy_ns(x, schedule, eps=1e-7):
    """Textbook iteration (transpose when tall, X <- aX + (bA + cA^2) X) in float64."""
    return newton_schulz(x, schedule, eps)


@pytest.mark.parametrize("shape", [(32, 64), (64, 32), (48, 48), (3, 16, 40), (3, 40, 16)])
def test_singular_values_in_band_for_random_inputs(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = orthogonalize(Tensor(x), FLAT5).asnumpy()
    assert y.shape == x.shape and y.dtype == np.float32
    s = _svals(y)
    assert s.min() > 0.65 and s.max() < 1.25, (s.min(), s.max())


def test_singular_values_in_band_for_ill_conditioned_input():
    rng = np.random.default_rng(1)
    u, _ = np.linalg.qr(rng.standard_normal((64, 64)))
    v, _ = np.linalg.qr(rng.standard_normal((128, 128)))
    x = (u * np.logspace(0, -2, 64)) @ v[:64]          # condition number 100
    s = _svals(orthogonalize(Tensor(x.astype(np.float32)), FLAT5).asnumpy())
    assert s.min() > 0.65 and s.max() < 1.25, (s.min(), s.max())


def test_matches_textbook_iteration_for_wide_tall_and_batched():
    rng = np.random.default_rng(2)
    for shape in [(24, 56), (56, 24), (4, 24, 56), (4, 56, 24)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = orthogonalize(Tensor(x), FLAT5).asnumpy()
        np.testing.assert_allclose(got, _numpy_ns(x, FLAT5), rtol=0, atol=2e-5)


def _max_rel(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


# the experts of a layer's 3-D weight (gate/up pieces [E, H, F], down [E, F, H]) and square
# projections; every schedule form (flat fp32 path with the folded norm, a preset cycle)
@pytest.mark.parametrize("shape", [(5, 20, 36), (8, 64, 32), (8, 32, 64), (4, 48, 48), (1, 24, 40)])
@pytest.mark.parametrize("schedule", [FLAT5, preset_schedule("polar_express", 8)])
def test_batched_equals_per_matrix_within_rel_1e_6(shape, schedule):
    """One batched NS (BatchMatMul, the CPU kernel) of a [batch, m, n] stack gives every
    matrix's per-matrix NS (MatMul) within rel 1e-6 in fp32 (on CPU: bit for bit), and both
    match the float64 numpy iteration."""
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    batched = orthogonalize(Tensor(x), schedule).asnumpy()
    assert batched.dtype == np.float32 and batched.shape == x.shape
    for i in range(shape[0]):
        single = orthogonalize(Tensor(x[i]), schedule).asnumpy()
        assert _max_rel(batched[i], single) <= 1e-6
        assert _max_rel(single, _numpy_ns(x[i], schedule)) < 2e-5
    assert _max_rel(batched, _numpy_ns(x, schedule)) < 2e-5


def test_converges_to_polar_factor_with_a_convergent_tail():
    # 5 quintic steps, then 12 cubic Newton-Schulz steps p(s) = 1.5 s - 0.5 s^3 (fixed point 1).
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 72))
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    schedule = normalize_ns_schedule([[list(DEFAULT_NS_COEFFICIENTS), 5], [[1.5, -0.5, 0.0], 12]], 99)
    y = orthogonalize(Tensor(x.astype(np.float32)), schedule).asnumpy()
    np.testing.assert_allclose(y, u @ vt, atol=2e-4)
    # the default 5 steps keep the singular vectors: U^T Y V is (nearly) diagonal
    y5 = orthogonalize(Tensor(x.astype(np.float32)), FLAT5).asnumpy().astype(np.float64)
    core = u.T @ y5 @ vt.T
    off = core - np.diag(np.diag(core))
    assert np.abs(off).max() < 1e-4 and np.diag(core).min() > 0.65


def test_flat_and_segmented_schedules_are_equivalent():
    x = Tensor(np.random.default_rng(5).standard_normal((16, 30)).astype(np.float32))
    seg = normalize_ns_schedule([[list(DEFAULT_NS_COEFFICIENTS), 2], [list(DEFAULT_NS_COEFFICIENTS), 3]], 7)
    assert seg == FLAT5
    np.testing.assert_array_equal(orthogonalize(x, seg).asnumpy(), orthogonalize(x, FLAT5).asnumpy())


def test_zero_input_stays_zero_and_eps_floors_the_norm():
    z = orthogonalize(Tensor(np.zeros((8, 12), np.float32)), FLAT5).asnumpy()
    assert np.all(z == 0) and np.all(np.isfinite(z))
    tiny = np.full((4, 6), 1e-12, np.float32)
    # ||X||_F = 4.9e-12 < eps = 1e-7: X / eps stays tiny; the iteration scales it by ~a^5
    y = orthogonalize(Tensor(tiny), FLAT5, eps=1e-7).asnumpy()
    np.testing.assert_allclose(y, _numpy_ns(tiny, FLAT5, eps=1e-7), rtol=1e-4)
    assert np.abs(y).max() < 1e-2


def test_input_is_not_modified_and_bf16_input_is_accepted():
    x = np.random.default_rng(6).standard_normal((8, 16)).astype(np.float32)
    t = Tensor(x)
    orthogonalize(t, FLAT5)
    np.testing.assert_array_equal(t.asnumpy(), x)
    yb = orthogonalize(Tensor(x).astype(ms.bfloat16), FLAT5)
    assert yb.dtype == ms.float32


def test_rejects_bad_rank_and_cpu_bf16():
    with pytest.raises(ValueError, match="2-D matrix or a 3-D batch"):
        orthogonalize(Tensor(np.zeros((2, 2, 2, 2), np.float32)), FLAT5)
    with pytest.raises(ValueError, match="ns_dtype bfloat16 needs Ascend"):
        orthogonalize(Tensor(np.ones((2, 3), np.float32)), FLAT5, ns_dtype=ms.bfloat16)


def test_ns_dtype_and_precision_by_device():
    assert default_ns_dtype("CPU") == ms.float32
    assert default_ns_dtype("Ascend") == ms.bfloat16
    configure_ns_precision("CPU")  # no-op off Ascend
    if not hasattr(getattr(ms, "device_context", None), "ascend") or not hasattr(
            ms.device_context.ascend.op_precision, "cube_math_type"):
        with pytest.raises(RuntimeError, match=r"cube_math_type\(4\) for Muon requires MindSpore"):
            configure_ns_precision("Ascend")


def test_scale_modes():
    assert muon_scale_factor(64, 256) == pytest.approx(16.0)
    assert muon_scale_factor(256, 64, "shape_scaling") == pytest.approx(2.0)
    assert muon_scale_factor(64, 256, "shape_scaling") == pytest.approx(1.0)
    assert muon_scale_factor(64, 256, "unit_rms_norm") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="muon_scale_mode must be one of"):
        muon_scale_factor(2, 2, "rms")


def test_presets_are_selectable_by_name():
    assert preset_schedule("simple", 5) == FLAT5
    q = preset_schedule("quintic", 5)
    assert len(q) == 5 and q[0] == (4.0848, -6.8946, 2.9270)
    x = np.random.default_rng(7).standard_normal((32, 48)).astype(np.float32)
    s = _svals(orthogonalize(Tensor(x), q).asnumpy())
    assert s.min() > 0.6 and s.max() < 1.25


def test_flop_count():
    assert ns_matmul_flops((1024, 4096), 5) == 5 * (4 * 1024 ** 2 * 4096 + 2 * 1024 ** 3)
    assert ns_matmul_flops((3, 40, 16), 2) == 2 * 3 * (4 * 16 * 16 * 40 + 2 * 16 ** 3)
