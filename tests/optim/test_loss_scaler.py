"""Loss scaler: Megatron dynamic scaling (window, hysteresis, floor), static, unscale."""
import numpy as np
import pytest
from mindspore import Tensor

from mindformers_core.optim.loss_scaler import (ConstantLossScaler, DynamicLossScaler,
                                                build_loss_scaler, unscale_and_check)


def test_growth_after_window():
    s = DynamicLossScaler(initial_loss_scale=8.0, loss_scale_window=3, hysteresis=2)
    for _ in range(2):
        s.update(False)
    assert s.scale == 8.0
    s.update(False)
    assert s.scale == 16.0 and s.growth_tracker == 0


def test_hysteresis_then_backoff_and_floor():
    s = DynamicLossScaler(initial_loss_scale=4.0, min_loss_scale=1.0, loss_scale_window=10,
                          hysteresis=2)
    s.update(True)
    assert s.scale == 4.0  # first overflow absorbed by hysteresis
    s.update(True)
    assert s.scale == 2.0
    s.update(True)
    assert s.scale == 1.0
    s.update(True)
    assert s.scale == 1.0  # never below min_loss_scale


def test_overflow_resets_growth_counter():
    s = DynamicLossScaler(initial_loss_scale=2.0, loss_scale_window=2, hysteresis=5)
    s.update(False)
    s.update(True)
    s.update(False)
    assert s.scale == 2.0
    s.update(False)
    assert s.scale == 4.0 and s.hysteresis_tracker == 5


def test_state_round_trip_and_static():
    s = DynamicLossScaler(initial_loss_scale=2.0, loss_scale_window=2)
    s.update(True)
    t = DynamicLossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()
    c = build_loss_scaler({"loss_scale": 128.0})
    assert isinstance(c, ConstantLossScaler)
    c.update(True)
    assert c.scale == 128.0
    d = build_loss_scaler({"initial_loss_scale": 1024.0, "hysteresis": 3})
    assert isinstance(d, DynamicLossScaler) and d.scale == 1024.0 and d.hysteresis == 3


@pytest.mark.parametrize("kwargs, msg", [
    (dict(initial_loss_scale=0.0), "initial_loss_scale must be a finite positive number"),
    (dict(min_loss_scale=-1.0), "min_loss_scale must be a finite positive number"),
    (dict(initial_loss_scale=1.0, min_loss_scale=2.0), r"min_loss_scale \(2.0\) must be <="),
    (dict(hysteresis=0), "hysteresis must be an integer >= 1, got 0"),
    (dict(loss_scale_window=float("inf")), "loss_scale_window must be a finite positive"),
])
def test_validation(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        DynamicLossScaler(**kwargs)
    with pytest.raises(ValueError, match="loss_scale must be a finite positive number"):
        ConstantLossScaler(0)


def test_unscale_and_check():
    out, inf = unscale_and_check([Tensor(np.array([4.0, 8.0], np.float32)), None], 4.0)
    np.testing.assert_array_equal(out[0].asnumpy(), [1.0, 2.0])
    assert out[1] is None and inf is False
    _, inf = unscale_and_check([Tensor(np.array([np.inf], np.float32))], 2.0)
    assert inf is True
