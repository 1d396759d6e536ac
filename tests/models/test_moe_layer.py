"""The dispatched MoE layer against the dense numpy reference, for every router option
combination: forward, aux loss, counts, drops and every gradient (rel 1e-5, fp32), plus a
finite-difference check of the MindSpore gradients and bit-identical repeat runs."""
import itertools

import numpy as np
import pytest
import mindspore as ms

from moe_numpy_reference import moe_forward
from moe_test_utils import build_layer, inputs, layer_params, moe_cfg, objective

SCORING = ("sigmoid", "softmax")
GROUPS = ((None, None), (2, 1))
BALANCING = ("seq_aux_loss", "aux_loss", "none")
CAPACITY = ((None, "probs"), (1.0, "probs"), (0.75, "position"))
NORM = (True, False)
# the shared expert only adds a term: its three forms are cycled over the combinations
SHARED = ({}, {"moe_shared_expert_intermediate_size": 6}, {"n_shared_experts": 0})
COMBOS = list(itertools.product(SCORING, GROUPS, BALANCING, CAPACITY, NORM))


def _cfg(i):
    scoring, (ng, tg), bal, (cf, policy), norm = COMBOS[i]
    return moe_cfg(scoring_func=scoring, n_group=ng, topk_group=tg,
                   moe_router_load_balancing_type=bal, moe_expert_capacity_factor=cf,
                   moe_token_drop_policy=policy, norm_topk_prob=norm, **SHARED[i % 3])


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


def _ref_objective(P, cfg, x, r):
    b, s, h = x.shape
    res = moe_forward(P, "", cfg, x.reshape(b * s, h), b, s)
    return float((res["out"] * r.reshape(b * s, h)).sum()) + (res["aux"] or 0.0), res


def _fd_grads(P, cfg, x, r, eps=1e-6):
    """Central differences of the float64 reference objective for x and every trainable array."""
    arrays = dict(P, x=x.astype(np.float64))
    grads = {}
    for name, arr in arrays.items():
        if name.endswith("expert_bias"):
            continue
        g = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            vals = []
            for d in (eps, -eps):
                arr[i] = old + d
                vals.append(_ref_objective({k: v for k, v in arrays.items() if k != "x"}, cfg,
                                           arrays["x"], r)[0])
            arr[i] = old
            g[i] = (vals[0] - vals[1]) / (2 * eps)
        grads[name] = g
    return grads


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(COMBOS)),
                         ids=["-".join(map(str, c)).replace(" ", "") for c in COMBOS])
def test_dispatch_equals_dense_reference_forward_and_grads(i):
    cfg = _cfg(i)
    layer = build_layer(cfg, seed=i)
    x, r = inputs(seed=100 + i)
    P = layer_params(layer)
    want, res = _ref_objective(P, cfg, x, r)
    out, aux = layer(ms.Tensor(x))
    b, s, h = x.shape
    assert _rel(out.asnumpy().reshape(b * s, h), res["out"]) < 1e-5
    if res["aux"] is None:
        assert aux is None
    else:
        assert abs(float(aux.asnumpy()) - res["aux"]) <= 1e-5 * abs(res["aux"])
    np.testing.assert_array_equal(np.sort(layer.last_topk.asnumpy(), 1), np.sort(res["topk"], 1))
    np.testing.assert_array_equal(layer.tokens_per_expert.asnumpy(), res["counts"])
    assert layer.dropped == res["dropped"]
    if cfg.moe_expert_capacity_factor == 0.75:
        assert res["dropped"] > 0          # the drop path is exercised

    params = layer.trainable_params()
    fn = ms.value_and_grad(objective(layer, r), grad_position=0, weights=params)
    value, (gx, gw) = fn(ms.Tensor(x))
    assert abs(float(value.asnumpy()) - want) <= 1e-5 * max(1.0, abs(want))
    fd = _fd_grads(P, cfg, x, r)
    assert _rel(gx.asnumpy(), fd["x"]) < 1e-5
    for p, g in zip(params, gw):
        assert _rel(g.asnumpy(), fd[p.name]) < 1e-5, p.name


def test_finite_difference_of_the_layer_itself():
    """Directional derivative of the MindSpore objective (fp32 central differences) equals
    <grad, d> for a random direction over the input and every trainable weight."""
    cfg = moe_cfg(n_group=2, topk_group=1, moe_expert_capacity_factor=1.0)
    layer = build_layer(cfg, seed=3)
    x, r = inputs(seed=4)
    params = layer.trainable_params()
    f = objective(layer, r)
    _, (gx, gw) = ms.value_and_grad(f, grad_position=0, weights=params)(ms.Tensor(x))
    rng = np.random.RandomState(5)
    dirs = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    dx = rng.standard_normal(x.shape).astype(np.float32)
    want = float((gx.asnumpy() * dx).sum()) + sum(float((g.asnumpy() * d).sum())
                                                  for g, d in zip(gw, dirs))
    base = [p.asnumpy().copy() for p in params]
    routed = layer.last_topk.asnumpy()
    eps = 1e-3
    vals = []
    for sign in (1, -1):
        for p, b0, d in zip(params, base, dirs):
            p.set_data(ms.Tensor(b0 + sign * eps * d))
        vals.append(float(f(ms.Tensor(x + sign * eps * dx)).asnumpy()))
        np.testing.assert_array_equal(layer.last_topk.asnumpy(), routed)   # same routing
    for p, b0 in zip(params, base):
        p.set_data(ms.Tensor(b0))
    fd = (vals[0] - vals[1]) / (2 * eps)
    assert abs(fd - want) <= 1e-3 * abs(want), (fd, want)


def test_two_runs_are_bit_identical():
    cfg = moe_cfg(n_group=2, topk_group=1, moe_expert_capacity_factor=1.0)
    x, r = inputs(seed=7)
    runs = []
    for _ in range(2):
        layer = build_layer(cfg, seed=9)
        fn = ms.value_and_grad(objective(layer, r), grad_position=0, weights=layer.trainable_params())
        value, (gx, gw) = fn(ms.Tensor(x))
        runs.append([value.asnumpy(), gx.asnumpy()] + [g.asnumpy() for g in gw]
                    + [layer.last_topk.asnumpy()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_tied_scores_route_to_the_lowest_expert_index():
    """All router weights 0: every score ties (sigmoid 0.5), so every token takes experts
    0..k-1 (bias 0) -- documented tie-break, not CPU topk's order."""
    cfg = moe_cfg(n_routed_experts=8, num_experts_per_tok=3)
    layer = build_layer(cfg, seed=0, bias_scale=0.0)
    layer.router.weight.set_data(ms.Tensor(np.zeros(layer.router.weight.shape, np.float32)))
    x, _ = inputs()
    layer(ms.Tensor(x))
    np.testing.assert_array_equal(layer.last_topk.asnumpy(), np.tile([0, 1, 2], (10, 1)))
