"""AdamW: numpy parity (fused and reference paths), moments, lr=0, decay, validation."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.optim.adamw import AdamW
from tests.optim.adamw_reference import numpy_adamw_step, rel_err

SHAPES = [(6, 5), (7,), (3, 4), (5,)]


def make_params(seed=0, dtype=ms.float32, shapes=SHAPES, prefix="w"):
    rng = np.random.default_rng(seed)
    return [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)).astype(dtype),
                      name=f"{prefix}{k}") for k, s in enumerate(shapes)]


def run_parity(impl, steps=30, decoupled=True):
    params = make_params()
    groups = [{"params": params[:2], "lr_mult": 2.0, "weight_decay": 0.1},
              {"params": params[2:3], "lr_mult": 0.5, "weight_decay": 0.0},
              {"params": params[3:], "wd_mult": 0.5, "betas": (0.8, 0.99), "eps": 1e-6}]
    opt = AdamW(groups, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05,
                impl=impl, decoupled_weight_decay=decoupled)
    hyper = [(2e-2, 0.1, 0.9, 0.999, 1e-8), (2e-2, 0.1, 0.9, 0.999, 1e-8),
             (5e-3, 0.0, 0.9, 0.999, 1e-8), (1e-2, 0.025, 0.8, 0.99, 1e-6)]
    ref = [[p.asnumpy().astype(np.float64), 0.0, 0.0] for p in params]
    rng = np.random.default_rng(1)
    for t in range(1, steps + 1):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        opt.step([Tensor(g) for g in grads])
        for k, (lr, wd, b1, b2, eps) in enumerate(hyper):
            p, m, v = numpy_adamw_step(*ref[k], grads[k], t, lr, b1, b2, eps, wd, decoupled)
            # fp32 storage between steps, as in any fp32 implementation
            ref[k] = [p.astype(np.float32), m.astype(np.float32), v.astype(np.float32)]
    return opt, params, ref


@pytest.mark.parametrize("impl", ["fused", "reference"])
@pytest.mark.parametrize("decoupled", [True, False])
def test_parity_with_numpy_30_steps_several_groups(impl, decoupled):
    opt, params, ref = run_parity(impl, decoupled=decoupled)
    assert opt.global_step == 30
    for k, p in enumerate(params):
        assert rel_err(p.asnumpy(), ref[k][0]) < 1e-6, (impl, k)
        assert rel_err(opt._state["adam_m"][k].asnumpy(), ref[k][1]) < 1e-6
        # The fused kernel's EMA runs with fp32(b2): for b2 = 0.999, 1 - fp32(b2) is 1.3e-5
        # off 1 - b2, so the raw v differs by that factor; the bias correction uses the same
        # fp32 betas, which is why the parameters above still match to 1e-6.
        v_tol = 2e-5 if impl == "fused" else 1e-6
        assert rel_err(opt._state["adam_v"][k].asnumpy(), ref[k][2]) < v_tol


def test_fused_equals_reference():
    _, fused, _ = run_parity("fused")
    _, plain, _ = run_parity("reference")
    for a, b in zip(fused, plain):
        assert rel_err(a.asnumpy(), b.asnumpy()) < 1e-6


def test_one_step_moments_closed_form():
    (p,) = make_params(shapes=[(4, 3)])
    g = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    opt = AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    opt.step([Tensor(g)])
    np.testing.assert_allclose(opt._state["adam_m"][0].asnumpy(), 0.1 * g, rtol=1e-6)
    np.testing.assert_allclose(opt._state["adam_v"][0].asnumpy(), 0.05 * g * g, rtol=1e-6)
    sd = opt.state_dict()
    np.testing.assert_allclose(sd["adam_m.w0"], 0.1 * g, rtol=1e-6)


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_lr_zero_still_advances_moments_and_keeps_params(impl):
    (p,) = make_params(shapes=[(5,)])
    before = p.asnumpy().copy()
    opt = AdamW([p], lr=0.0, weight_decay=0.1, impl=impl)
    g = np.full((5,), 2.0, np.float32)
    opt.step([Tensor(g)])
    np.testing.assert_array_equal(p.asnumpy(), before)
    np.testing.assert_allclose(opt._state["adam_m"][0].asnumpy(), 0.2, rtol=1e-6)
    assert opt.global_step == 1


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_zero_grad_gives_pure_decay(impl):
    (p,) = make_params(shapes=[(3, 3)])
    w = p.asnumpy().copy()
    opt = AdamW([p], lr=0.1, weight_decay=0.2, impl=impl)
    opt.step([Tensor(np.zeros((3, 3), np.float32))])
    np.testing.assert_allclose(p.asnumpy(), w * (1 - 0.1 * 0.2), rtol=1e-6)


def test_none_grad_skips_parameter_entirely():
    a, b = make_params(shapes=[(3,), (3,)])
    a0 = a.asnumpy().copy()
    opt = AdamW([a, b], lr=0.1, weight_decay=0.5)
    opt.step([None, Tensor(np.ones(3, np.float32))])
    np.testing.assert_array_equal(a.asnumpy(), a0)
    assert not np.any(opt._state["adam_m"][0].asnumpy())


def test_bf16_grad_accepted_and_cast():
    (p,) = make_params(shapes=[(4,)])
    opt = AdamW([p], lr=1e-2, weight_decay=0.0)
    g = Tensor(np.array([1.0, -2.0, 0.5, 4.0], np.float32)).astype(ms.bfloat16)
    opt.step([g])
    np.testing.assert_allclose(opt._state["adam_m"][0].asnumpy(), [0.1, -0.2, 0.05, 0.4],
                               rtol=1e-6)


def test_set_lr_and_group_lrs():
    params = make_params()
    opt = AdamW([{"params": params[:2], "lr_mult": 3.0}, {"params": params[2:]}], lr=1.0)
    opt.set_lr(0.5)
    assert opt.group_lrs == [1.5, 0.5]
    opt.set_group_lrs([0.1, 0.2])
    assert opt.group_lrs == [0.1, 0.2]
    with pytest.raises(ValueError, match="set_group_lrs got 1 values for 2 parameter groups"):
        opt.set_group_lrs([0.1])
    assert opt.parameters == tuple(params)


def test_step_checks_gradient_count():
    opt = AdamW(make_params(), lr=1.0)
    with pytest.raises(ValueError, match="AdamW.step got 1 gradients for 4 parameters"):
        opt.step([None])


@pytest.mark.parametrize("kwargs, exc, msg", [
    (dict(eps=-1.0), ValueError, r"Invalid epsilon value: -1.0, should be >= 0."),
    (dict(betas=(1.0, 0.9)), ValueError,
     r"Invalid beta parameter at index 0: 1.0, should be >= 0 and < 1."),
    (dict(betas=(0.9, -0.1)), ValueError,
     r"Invalid beta parameter at index 1: -0.1, should be >= 0 and < 1."),
    (dict(weight_decay=-0.5), ValueError, r"Invalid weight_decay value: -0.5, should be >= 0."),
    (dict(betas=(0, 0.95)), TypeError,
     r"For 'AdamW', the type of 'betas\[0\]' should be 'float', but got type 'int'."),
    (dict(betas=(0.9, 0.95, 0.99)), ValueError,
     r"For 'AdamW', the betas size should be in : \[2\], but got 3."),
    (dict(eps=1), TypeError, r"For 'AdamW', the type of 'eps' should be 'float', but got type 'int'."),
    (dict(weight_decay=0), TypeError,
     r"For 'AdamW', the type of 'weight_decay' should be 'float', but got type 'int'."),
    (dict(foo=1), TypeError, r"AdamW got unexpected keyword arguments \['foo'\]"),
    (dict(impl="x"), ValueError, r"impl must be one of \['fused', 'reference'\], got 'x'"),
    (dict(exp_avg_dtype="fp16"), ValueError, r"state dtype must be 'fp32' or 'bf16', got 'fp16'"),
    (dict(embedding_min_norm=0.0), ValueError, "embedding_min_norm must be a finite positive"),
])
def test_validation_messages(kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        AdamW(make_params(), **kwargs)


def test_validation_order_eps_before_betas_before_wd():
    with pytest.raises(ValueError, match="Invalid epsilon value"):
        AdamW(make_params(), eps=-1.0, betas=(2.0, 0.9), weight_decay=-1.0)
    with pytest.raises(ValueError, match="index 0"):
        AdamW(make_params(), betas=(2.0, 0.9), weight_decay=-1.0)
    with pytest.raises(ValueError, match="Invalid weight_decay"):
        AdamW(make_params(), betas=(0, 0.95), weight_decay=-1.0)


@pytest.mark.parametrize("groups, exc, msg", [
    ([], ValueError, "empty parameter list"),
    ([{"lr_mult": 1.0}], ValueError, "parameter group 0 has no 'params' key"),
    ([np.zeros(3)], TypeError, "must be mindspore Parameters, got ndarray"),
])
def test_group_errors(groups, exc, msg):
    with pytest.raises(exc, match=msg):
        AdamW(groups)


def test_duplicate_parameter_rejected():
    p = make_params()
    with pytest.raises(ValueError, match="parameter 'w0' appears in more than one group"):
        AdamW([{"params": p[:2]}, {"params": p[:1]}])


def test_group_override_validated():
    with pytest.raises(ValueError, match=r"parameter group 0: Invalid beta parameter at index 1"):
        AdamW([{"params": make_params(), "betas": (0.9, 1.5)}])


def test_bf16_moments_reference_path_tracks_fp32():
    p32 = make_params(shapes=[(8, 8)], prefix="a")
    p16 = make_params(shapes=[(8, 8)], prefix="a")
    ref = AdamW(p32, lr=1e-2, weight_decay=0.0)
    low = AdamW(p16, lr=1e-2, weight_decay=0.0, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert low.impl == "reference"
    assert low._state["adam_m"][0].dtype == ms.bfloat16
    rng = np.random.default_rng(5)
    for _ in range(5):
        g = Tensor(rng.standard_normal((8, 8)).astype(np.float32))
        ref.step([g])
        low.step([g])
    assert rel_err(p16[0].asnumpy(), p32[0].asnumpy()) < 5e-3
    assert low.state_dict()["adam_m.a0"].dtype == np.float32


@pytest.mark.parametrize("lr, wd", [(1.0, 1.0), (0.5, 0.1)])
def test_fused_decay_order_branches_match_numpy(lr, wd):
    """lr*wd = 1 takes the decay-first branch (no division by c = 0); else decay-after."""
    (p,) = make_params(shapes=[(4, 4)])
    w = p.asnumpy().copy()
    g = np.random.default_rng(9).standard_normal((4, 4)).astype(np.float32)
    opt = AdamW([p], lr=lr, weight_decay=wd, betas=(0.9, 0.95), eps=1e-8)
    opt.step([Tensor(g)])
    want, _, _ = numpy_adamw_step(w, 0.0, 0.0, g, 1, lr, 0.9, 0.95, 1e-8, wd)
    assert rel_err(p.asnumpy(), want) < 1e-6


def test_compiled_group_graph_matches_eager_kernels():
    """Groups >= graph_min_numel run one compiled graph; same result as per-parameter launches."""
    rng = np.random.default_rng(11)
    init = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)]
    grads = [[Tensor(rng.standard_normal((256, 256)).astype(np.float32)) for _ in range(2)]
             for _ in range(3)]

    def run(graph_min_numel):
        ps = [Parameter(Tensor(init[0]), name="g0"),
              Parameter(Tensor(init[1]).astype(ms.bfloat16), name="g1")]
        opt = AdamW(ps, lr=1e-2, weight_decay=0.1, graph_min_numel=graph_min_numel, host_kernel=False)
        for g in grads:
            opt.step(g)
        used_graph = any(c is not None for c in opt._graphs.values())
        return [m.asnumpy().copy() for m in opt.main_params], used_graph

    graph, used = run(1 << 16)
    eager, not_used = run(None)
    assert used and not not_used
    for a, b in zip(graph, eager):
        assert rel_err(a, b) < 1e-6


def test_graph_compile_failure_falls_back_to_eager(monkeypatch):
    from mindformers_core.optim import adamw as adamw_mod

    class Broken:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args):
            raise RuntimeError("cannot compile")

    monkeypatch.setattr(adamw_mod, "FusedAdamGroup", Broken)
    rng = np.random.default_rng(12)
    init = rng.standard_normal((256, 256)).astype(np.float32)
    g = Tensor(rng.standard_normal((256, 256)).astype(np.float32))
    out = []
    for limit in (1 << 16, None):
        p = Parameter(Tensor(init), name="x")
        opt = AdamW([p], lr=1e-2, weight_decay=0.1, graph_min_numel=limit, host_kernel=False)
        opt.step([g])
        opt.step([g])
        out.append(p.asnumpy().copy())
        assert all(c is None for c in opt._graphs.values())
    np.testing.assert_array_equal(out[0], out[1])


def test_graph_dropped_when_masters_are_rebuilt_each_step():
    """A subclass whose masters are new objects every step (sharded rows) must not keep
    updating the first step's objects through a stale compiled graph."""
    rng = np.random.default_rng(13)
    init = rng.standard_normal((256, 256)).astype(np.float32)
    g = Tensor(rng.standard_normal((256, 256)).astype(np.float32))
    results = []
    for limit in (1 << 16, None):
        p = Parameter(Tensor(init).astype(ms.bfloat16), name="r")
        opt = AdamW([p], lr=1e-2, weight_decay=0.1, graph_min_numel=limit, host_kernel=False)
        original_master = opt._masters.master

        def fresh_master(i, _orig=original_master):
            m = _orig(i)  # a new Parameter holding the same values, as a sharded view would
            copy = Parameter(Tensor(m.asnumpy().copy()), name=m.name)
            m.set_data(copy)  # keep the persistent one in sync through store below
            return copy

        opt._masters.master = fresh_master
        for _ in range(3):
            opt.step([g])
        results.append(p.astype(ms.float32).asnumpy())
    np.testing.assert_array_equal(results[0], results[1])


def test_enable_cpu_offload_is_honoured_on_cpu():
    """On CPU the state already lives in host memory: True gives the very same update."""
    out = []
    for offload in (False, True):
        ps = make_params()
        opt = AdamW(ps, lr=1e-2, enable_cpu_offload=offload)
        assert opt.enable_cpu_offload is offload
        opt.step([Tensor(np.full(p.shape, 0.5, np.float32)) for p in ps])
        out.append([p.asnumpy() for p in ps])
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)

