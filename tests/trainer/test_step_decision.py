"""The pure skip/clip decision of a step (trainer.step_decision) against its rules."""
import math

import pytest

from mindformers_core.trainer.step_decision import (NONFINITE, OVERFLOW, SKIP_LIMIT, THRESHOLD,
                                                    StepDecision, decide_step)

NAN, INF = math.nan, math.inf


def test_finite_norm_within_bounds_applies_unclipped():
    d = decide_step(0.5, max_norm=1.0)
    assert d == StepDecision(None) and d.applied and d.clip_coef is None


def test_clip_coefficient_is_max_norm_over_norm_plus_eps():
    d = decide_step(4.0, max_norm=1.0)
    assert d.applied and d.clip_coef == pytest.approx(1.0 / (4.0 + 1e-6), rel=1e-15)
    assert decide_step(4.0, max_norm=None).clip_coef is None          # clipping off
    assert decide_step(1.0 - 2e-6, max_norm=1.0).clip_coef is None    # coef >= 1
    assert decide_step(1.0, max_norm=1.0).clip_coef is not None       # 1 / (1 + 1e-6) < 1


@pytest.mark.parametrize("norm", [NAN, INF, -INF])
def test_overflow_under_dynamic_loss_scaling_skips_and_counts(norm):
    d = decide_step(norm, max_norm=1.0, dynamic_loss_scaling=True)
    assert d == StepDecision(OVERFLOW) and not d.applied
    # an overflow counts toward the consecutive-skip limit like every other skip
    d = decide_step(norm, max_norm=1.0, dynamic_loss_scaling=True, consecutive_skipped=2,
                    max_consecutive_skipped=3)
    assert d == StepDecision(OVERFLOW, error=SKIP_LIMIT)


def test_nonfinite_without_skip_on_nan_is_an_error():
    d = decide_step(NAN, max_norm=1.0)
    assert d.error == NONFINITE and d.skip is None and not d.applied


def test_nonfinite_with_skip_on_nan_counts_and_hits_the_limit():
    kw = dict(max_norm=1.0, use_skip_step_on_nan=True, max_consecutive_skipped=3)
    assert decide_step(INF, consecutive_skipped=1, **kw) == StepDecision(NONFINITE)
    assert decide_step(INF, consecutive_skipped=2, **kw).error == SKIP_LIMIT   # the 3rd in a row
    no_limit = dict(kw, max_consecutive_skipped=0)
    assert decide_step(INF, consecutive_skipped=10 ** 6, **no_limit).error is None


def test_threshold_skip_counts():
    d = decide_step(5.0, max_norm=1.0, skip_threshold=4.0)
    assert d == StepDecision(THRESHOLD)
    d = decide_step(5.0, max_norm=1.0, skip_threshold=4.0, consecutive_skipped=3,
                    max_consecutive_skipped=4)
    assert d == StepDecision(THRESHOLD, error=SKIP_LIMIT)
    assert decide_step(4.0, max_norm=1.0, skip_threshold=4.0).applied   # not above it
