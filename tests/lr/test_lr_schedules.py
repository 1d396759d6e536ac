"""Closed-form values at phase boundaries for every schedule, and where we deliberately differ
from upstream (docs/differences.md, rows 16-17): never NaN, never negative, never rising after the decay."""
import math

import numpy as np
import pytest

from lr_upstream_reference import upstream_curve
from mindformers_core.core.lr import LR_SCHEDULERS, build_lr_scheduler


def build(T=100, **kw):
    return build_lr_scheduler(kw, T)


def test_warmup_convention_is_init_plus_slope_times_step_over_w():
    s = build(type="ConstantWarmUpLR", learning_rate=1e-3, warmup_steps=10, warmup_lr_init=1e-4)
    assert s.lr_at(0) == 1e-4                       # first update uses warmup_lr_init
    assert s.lr_at(5) == pytest.approx(1e-4 + 9e-4 * 0.5, abs=1e-18)
    assert s.lr_at(9) == pytest.approx(1e-4 + 9e-4 * 0.9, abs=1e-18)
    assert s.lr_at(10) == 1e-3 and s.lr_at(10**9) == 1e-3
    assert s.boundaries()["warmup_end"] == 10
    # default warmup_lr_init 0: first update has lr 0
    assert build(type="linear", learning_rate=1e-3, warmup_steps=4).lr_at(0) == 0.0


def test_warmup_ratio_truncates():
    s = build(type="ConstantWarmUpLR", learning_rate=1e-3, warmup_ratio=0.29)
    assert s.boundaries()["warmup_end"] == 28       # int(100 * 0.29) == 28, not 29
    assert s.lr_at(27) < 1e-3 and s.lr_at(28) == 1e-3


def test_linear_reaches_zero_at_total_and_stays():
    s = build(type="LinearWithWarmUpLR", learning_rate=1e-3, warmup_steps=20)
    assert s.lr_at(20) == 1e-3
    assert s.lr_at(60) == pytest.approx(1e-3 * 40 / 80, abs=1e-18)
    assert s.lr_at(100) == 0.0 and s.lr_at(150) == 0.0


def test_cosine_boundaries_and_cutoff():
    s = build(type="CosineWithWarmUpLR", learning_rate=1e-3, warmup_steps=20, lr_end=1e-5)
    assert s.lr_at(20) == pytest.approx(1e-3, abs=1e-18)
    assert s.lr_at(60) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, abs=1e-15)
    assert s.lr_at(100) == 1e-5 and s.lr_at(500) == 1e-5
    # decay_steps truncates (does not stretch): the cosine still spans T - W
    cut = build(type="CosineWithWarmUpLR", learning_rate=1e-3, warmup_steps=20, decay_steps=60)
    assert cut.lr_at(59) == pytest.approx(s.lr_at(59) - 1e-5 * (1 - 0.5 * (1 + math.cos(math.pi * 39 / 80))), abs=1e-15)
    assert cut.lr_at(60) == 0.0 and cut.boundaries()["decay_end"] == 60
    # decay_ratio is int(T * r)
    r = build(type="CosineWithWarmUpLR", learning_rate=1e-3, decay_ratio=0.555)
    assert r.boundaries()["decay_end"] == 55 and r.lr_at(55) == 0.0 and r.lr_at(54) > 0


def test_cosine_decay_steps_beyond_total_holds_lr_end_instead_of_rising():
    p = dict(learning_rate=1e-3, warmup_steps=10, decay_steps=150, lr_end=1e-5)
    ref = upstream_curve("CosineWithWarmUpLR", p, 100, np.arange(100, 150))
    assert np.any(np.diff(ref) > 0)                 # upstream rises again after T
    s = build(type="CosineWithWarmUpLR", **p)
    assert [s.lr_at(k) for k in range(100, 200)] == [1e-5] * 100


def test_cosine_with_restarts_cycles_and_holds_lr_end():
    s = build(type="CosineWithRestartsAndWarmUpLR", learning_rate=1e-3, warmup_steps=10,
              num_cycles=3.0, lr_end=1e-5)
    # cycles restart at W + k*(T-W)/3 = 10, 40, 70
    for start in (10, 40, 70):
        assert s.lr_at(start) == pytest.approx(1e-3, abs=1e-18)
    assert s.lr_at(25) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, abs=1e-15)
    assert s.lr_at(100) == 1e-5
    # upstream returns 0 (not lr_end) for s in [T, decay_steps) when decay_steps > T
    p = dict(learning_rate=1e-3, warmup_steps=10, decay_steps=120, lr_end=1e-5)
    ref = upstream_curve("CosineWithRestartsAndWarmUpLR", p, 100, np.arange(100, 121))
    assert np.all(ref[:20] == 0) and ref[20] == np.float32(1e-5)
    t = build(type="CosineWithRestartsAndWarmUpLR", **p)
    assert [t.lr_at(k) for k in range(100, 130)] == [1e-5] * 30


def test_polynomial_boundaries_and_hold():
    s = build(type="PolynomialWithWarmUpLR", learning_rate=1e-3, warmup_steps=10, power=2.0,
              lr_end=1e-5)
    assert s.lr_at(10) == pytest.approx(1e-3, abs=1e-18)
    assert s.lr_at(55) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.25, abs=1e-15)
    assert s.lr_at(100) == pytest.approx(1e-5, abs=1e-18) and s.lr_at(101) == 1e-5


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_polynomial_short_decay_holds_lr_end_where_upstream_breaks(power):
    p = dict(learning_rate=1e-3, warmup_steps=10, decay_steps=50, power=power, lr_end=1e-6)
    ref = upstream_curve("PolynomialWithWarmUpLR", p, 100, np.arange(0, 101))
    # upstream: negative (power 1), climbs back to eta (power 2), NaN (power 0.5)
    bad = {1.0: np.any(ref < 0), 2.0: ref[100] > 0.5e-3 > ref[60], 0.5: np.any(np.isnan(ref))}[power]
    assert bad
    s = build(type="PolynomialWithWarmUpLR", **p)
    ours = [s.lr_at(k) for k in range(0, 201)]
    np.testing.assert_allclose(ours[:61], ref[:61], rtol=1e-6, atol=1e-9)
    assert ours[60:] == [1e-6] * 141
    assert s.boundaries()["decay_end"] == 60


def test_wsd_linear_boundaries_clamp_and_zero_warmup():
    s = build(type="WarmUpStableDecayLR", learning_rate=1e-3, warmup_steps=10,
              decay_start_steps=80, lr_end=1e-5)
    assert s.lr_at(10) == 1e-3 and s.lr_at(79) == 1e-3
    assert s.lr_at(90) == pytest.approx(1e-3 - (1e-3 - 1e-5) * 0.5, abs=1e-18)
    assert s.lr_at(100) == 1e-5
    assert s.lr_at(130) == 1e-5                     # upstream keeps falling below 0
    ref = upstream_curve("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=10,
                         decay_start_steps=80, lr_end=1e-5), 100, [130])
    assert ref[0] < 0
    z = build(type="WarmUpStableDecayLR", learning_rate=1e-3, warmup_steps=0, decay_start_steps=50)
    ref0 = upstream_curve("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=0,
                          decay_start_steps=50), 100, [0])
    assert np.isnan(ref0[0])                         # upstream: 0/0 at step 0
    assert z.lr_at(0) == 1e-3                        # ours starts at the peak


def test_wsd_decay_styles():
    kw = dict(type="wsd", learning_rate=1e-3, warmup_steps=0, decay_start_ratio=0.5, lr_end=0.0)
    lin = build(**kw)
    cos = build(**kw, decay_style="cosine")
    sq = build(**kw, decay_style="1-sqrt")
    assert lin.lr_at(75) == pytest.approx(5e-4, abs=1e-18)
    assert cos.lr_at(75) == pytest.approx(5e-4, abs=1e-15)       # (1 + cos(pi/2)) / 2
    assert cos.lr_at(60) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.2)), abs=1e-15)
    assert sq.lr_at(75) == pytest.approx(1e-3 * (1 - math.sqrt(0.5)), abs=1e-15)
    for s in (lin, cos, sq):
        assert s.lr_at(50) == pytest.approx(1e-3, abs=1e-18) and s.lr_at(100) == 0.0


def test_wsd_decay_start_at_or_after_total_holds_then_floor():
    s = build(type="WarmUpStableDecayLR", learning_rate=1e-3, warmup_steps=5,
              decay_start_ratio=1.0, lr_end=1e-6)
    assert s.lr_at(99) == 1e-3 and s.lr_at(100) == 1e-6 and s.lr_at(150) == 1e-6
    ref = upstream_curve("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=5,
                         decay_start_ratio=1.0, lr_end=1e-6), 100, [100])
    assert not np.isfinite(ref[0])


def test_cooldown_phases_and_lr_end2():
    kw = dict(type="ConstantWithCoolDownLR", learning_rate=1e-3, warmup_steps=10,
              keep_steps=20, decay_steps=40, final_steps=10, lr_end1=1e-4)
    s = build(**kw, lr_end2=1e-5)
    assert s.lr_at(29) == 1e-3
    assert s.lr_at(50) == pytest.approx(1e-4 + 9e-4 * 0.5, abs=1e-15)
    assert s.lr_at(70) == 1e-4 and s.lr_at(79) == 1e-4
    assert s.lr_at(80) == 1e-5 and s.lr_at(500) == 1e-5
    assert s.boundaries() == {"warmup_end": 10, "warmup_steps": 10, "decay_start": 30,
                              "decay_end": 80, "decay_start_steps": 30, "decay_steps": 40,
                              "cooldown_end": 70, "final_end": 80}
    assert build(**kw).lr_at(90) == 1e-4            # lr_end2 unset -> lr_end1
    # upstream takes ``lr_end2 or lr_end1``: an explicit 0.0 also means lr_end1, and that curve
    # is sane, so ours matches it (issue 10: equal wherever upstream is sane)
    assert build(**kw, lr_end2=0.0).lr_at(90) == 1e-4


def test_cosine_annealing_is_periodic_like_torch():
    s = build(type="CosineAnnealingLR", base_lr=1e-3, t_max=50, eta_min=1e-5)
    assert s.lr_at(0) == 1e-3
    assert s.lr_at(50) == pytest.approx(1e-5, abs=1e-18)
    assert s.lr_at(25) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5, abs=1e-15)
    assert s.lr_at(100) == pytest.approx(1e-3, abs=1e-15)   # period 2 * t_max


@pytest.mark.parametrize("t0,m,restarts", [(10, 2, [10, 30, 70, 150]), (7, 3, [7, 28, 91, 280]),
                                           (5, 1, [5, 10, 15, 1000])])
def test_warm_restarts_land_exactly_on_boundaries(t0, m, restarts):
    s = build(type="CosineAnnealingWarmRestarts", base_lr=1e-3, t_0=t0, t_mult=m, eta_min=1e-6)
    length = t0
    for i, r in enumerate(restarts):
        assert s.lr_at(r) == 1e-3                   # t_cur == 0 at each restart
        if m > 1 or i == 0:
            length = t0 * m ** i                    # the cycle that ends at r
        before = 1e-6 + (1e-3 - 1e-6) * 0.5 * (1 + math.cos(math.pi * (length - 1) / length))
        assert s.lr_at(r - 1) == pytest.approx(before, rel=1e-12)
    assert s.lr_at(10**12) <= 1e-3


def test_inverse_sqrt():
    s = build(type="inverse_sqrt", learning_rate=1e-3, warmup_steps=16)
    assert s.lr_at(8) == pytest.approx(5e-4, abs=1e-18)
    assert s.lr_at(16) == 1e-3
    assert s.lr_at(64) == pytest.approx(5e-4, abs=1e-18)   # sqrt(16 / 64)
    assert s.lr_at(1600) == pytest.approx(1e-4, abs=1e-18)
    f = build(type="InverseSqrtLR", learning_rate=1e-3, warmup_steps=16, lr_end=2e-4)
    assert f.lr_at(1600) == 2e-4 and f.lr_at(10**9) == 2e-4
    z = build(type="InverseSqrtLR", learning_rate=1e-3)
    assert z.lr_at(0) == 1e-3 and z.lr_at(1) == 1e-3 and z.lr_at(4) == pytest.approx(5e-4)


def test_learning_rate_wise_layer_from_nested_section():
    s = build(type="LearningRateWiseLayer", lr_scale=0.1,
              base_lr={"type": "cosine", "learning_rate": 1e-3, "warmup_steps": 10})
    inner = build(type="cosine", learning_rate=1e-3, warmup_steps=10)
    for k in (0, 5, 10, 55, 99, 100, 150):
        assert s.lr_at(k) == pytest.approx(0.1 * inner.lr_at(k), rel=1e-15, abs=0)
    assert s.peak_lr == pytest.approx(1e-4)
    assert s.boundaries() == inner.boundaries()


def test_registry_has_every_name_and_alias():
    expected = {"ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR",
                "CosineWithRestartsAndWarmUpLR", "PolynomialWithWarmUpLR", "WarmUpStableDecayLR",
                "CosineAnnealingLR", "ConstantWithCoolDownLR", "CosineAnnealingWarmRestarts",
                "LearningRateWiseLayer", "InverseSqrtLR", "constant_with_warmup", "linear",
                "cosine", "cosine_with_restarts", "polynomial", "cosine_annealing",
                "cosine_annealing_warm_restarts", "wsd", "inverse_sqrt"}
    assert set(LR_SCHEDULERS) == expected
    assert LR_SCHEDULERS["wsd"] is LR_SCHEDULERS["WarmUpStableDecayLR"]
    a = build(type="cosine", learning_rate=1e-3, warmup_steps=3)
    assert a.to_dict()["type"] == "CosineWithWarmUpLR"


@pytest.mark.parametrize("section", [
    {"type": "ConstantWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 10},
    {"type": "LinearWithWarmUpLR", "learning_rate": 1e-3, "warmup_lr_init": 5e-4},
    {"type": "PolynomialWithWarmUpLR", "learning_rate": 1e-3},
    {"type": "CosineWithWarmUpLR", "learning_rate": 1e-3, "decay_ratio": 0.0},
    {"type": "WarmUpStableDecayLR", "learning_rate": 1e-3, "decay_start_steps": 5},
    {"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3, "t_0": 3, "t_mult": 2},
    {"type": "CosineAnnealingLR", "base_lr": 1e-3, "t_max": 3},
    {"type": "InverseSqrtLR", "learning_rate": 1e-3, "warmup_steps": 4},
    {"type": "ConstantWithCoolDownLR", "learning_rate": 1e-3},
], ids=lambda s: s["type"])
def test_step_before_the_first_update_gets_lr_of_step_zero(section):
    s = build_lr_scheduler(section, 20)
    # upstream extrapolates: ConstantWarmUp(1e-3, W=10)(-1) = -1e-4; Linear W=0 goes above eta
    assert s.lr_at(-1) == s.lr_at(0) and s.lr_at(-100) == s.lr_at(0)
