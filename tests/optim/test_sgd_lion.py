"""SGD (momentum, nesterov, coupled L2) and Lion against numpy references."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor

from mindformers_core.optim.lion import Lion
from mindformers_core.optim.sgd import SGD
from tests.optim.adamw_reference import numpy_lion_step, numpy_sgd_step, rel_err


def params(seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)), name=f"p{k}")
            for k, s in enumerate([(4, 3), (5,)])]


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_numpy(nesterov):
    ps = params()
    opt = SGD([{"params": ps[:1], "lr_mult": 2.0}, {"params": ps[1:], "weight_decay": 0.0}],
              lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=nesterov)
    ref = [(p.asnumpy().astype(np.float64), None) for p in ps]
    hyper = [(0.1, 0.1), (0.05, 0.0)]
    rng = np.random.default_rng(1)
    for _ in range(10):
        gs = [rng.standard_normal(p.shape).astype(np.float32) for p in ps]
        opt.step([Tensor(g) for g in gs])
        ref = [numpy_sgd_step(r[0], r[1], g, lr, 0.9, wd, nesterov)
               for r, g, (lr, wd) in zip(ref, gs, hyper)]
    for p, r in zip(ps, ref):
        assert rel_err(p.asnumpy(), r[0]) < 1e-6
    sd = opt.state_dict()
    assert rel_err(sd["momentum_buffer.p0"], ref[0][1]) < 1e-6


def test_sgd_state_round_trip_continues_identically():
    a, b = params(), params()
    oa, ob = SGD(a, lr=0.1, momentum=0.9), SGD(b, lr=0.1, momentum=0.9)
    g = [Tensor(np.ones(p.shape, np.float32)) for p in a]
    oa.step(g)
    ob.step(g)
    oc = SGD(b, lr=0.1, momentum=0.9)
    oc.load_state_dict(ob.state_dict())
    oa.step(g)
    oc.step(g)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())


def test_sgd_validation():
    with pytest.raises(ValueError, match="Invalid momentum value: 1.0, should be >= 0 and < 1."):
        SGD(params(), momentum=1.0)
    with pytest.raises(ValueError, match="Invalid weight_decay value: -1.0"):
        SGD(params(), weight_decay=-1.0)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum > 0"):
        SGD(params(), momentum=0.0, nesterov=True)


def test_lion_matches_numpy():
    ps = params(3)
    opt = Lion([{"params": ps[:1]}, {"params": ps[1:], "lr_mult": 0.5, "weight_decay": 0.0}],
               lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ref = [(p.asnumpy().astype(np.float64), 0.0) for p in ps]
    hyper = [(1e-2, 0.1), (5e-3, 0.0)]
    rng = np.random.default_rng(4)
    for _ in range(10):
        gs = [rng.standard_normal(p.shape).astype(np.float32) for p in ps]
        opt.step([Tensor(g) for g in gs])
        ref = [numpy_lion_step(r[0], r[1], g, lr, 0.9, 0.99, wd)
               for r, g, (lr, wd) in zip(ref, gs, hyper)]
    for p, r in zip(ps, ref):
        assert rel_err(p.asnumpy(), r[0]) < 1e-6
    assert rel_err(opt.state_dict()["lion_m.p1"], ref[1][1]) < 1e-6


def test_lion_validation():
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        Lion(params(), betas=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"betas size should be in : \[2\], but got 1"):
        Lion(params(), betas=(0.9,))
