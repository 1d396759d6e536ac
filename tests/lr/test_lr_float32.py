"""The float32 rounding the schedules use to reproduce MindFormers' float32 arithmetic."""
import math
import random

import numpy as np
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.core.lr import build_lr_scheduler
from mindformers_core.core.lr.float32 import F32_MAX, f32, f32_const, f32_exact


def _cases(n, seed):
    rnd = random.Random(seed)
    for _ in range(n):
        k = rnd.random()
        if k < 0.4:
            x = rnd.random() * 10 ** rnd.uniform(-30, 30)
        elif k < 0.7:   # exact ties: 25 significant bits ending in 1
            x = ((2 * (rnd.getrandbits(24) | (1 << 23)) + 1) * 2.0 ** rnd.randint(-100, 60))
        else:           # results of float32 ops computed in float64
            a, b = (f32_exact(rnd.random() * 10 ** rnd.uniform(-8, 2)) for _ in range(2))
            x = rnd.choice([a * b, a / b, a + b, a - b])
        yield -x if rnd.random() < 0.5 else x


def test_f32_equals_numpy_float32_rounding_including_ties():
    xs = list(_cases(20000, 3))
    want = np.array(xs, dtype=np.float64).astype(np.float32).astype(np.float64)
    assert [f32(x) for x in xs] == want.tolist()
    assert [f32_exact(x) for x in xs] == want.tolist()
    assert f32(0.0) == 0.0 and f32(1e-3) == float(np.float32(1e-3))


def test_f32_const_rejects_values_float32_cannot_hold():
    assert f32_const(F32_MAX, "x") == F32_MAX
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.learning_rate: must be representable "
                                          r"as float32 .*got 1e\+39"):
        build_lr_scheduler({"type": "ConstantWarmUpLR", "learning_rate": 1e39,
                            "warmup_steps": 0}, 10)
    with pytest.raises(ConfigError, match="must be representable as float32"):
        f32_const(math.inf, "x")


def test_mindspore_cpu_cos_is_the_correctly_rounded_float32_cosine():
    # the premise of the emulation: float32 cos(x) == float32(float64 cos(x))
    ms = pytest.importorskip("mindspore")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(0, 4, 4000), rng.uniform(0, 400, 4000),
                        np.pi + rng.uniform(-1e-2, 1e-2, 2000)]).astype(np.float32)
    got = ms.ops.cos(ms.Tensor(x)).asnumpy()
    want = np.cos(x.astype(np.float64)).astype(np.float32)
    assert np.array_equal(got, want)
