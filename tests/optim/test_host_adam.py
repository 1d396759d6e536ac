"""The host Adam kernel (optim/host/adam.py, host_adam.c) against an op-by-op fp32 numpy
reference, against the ops.Adam paths it replaces, and its fallbacks."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.optim.host import adam as host_adam
from mindformers_core.optim.adamw import AdamW
from mindformers_core.optim.host.adam import host_adam_kernel, host_adam_unavailable_reason
from mindformers_core.models.build import build_model
from mindformers_core.optim.muon import Muon

from tests.optim.adamw_reference import numpy_adamw_step, rel_err

# odd sizes: blocks end inside tensors, tensors end inside blocks, one tensor spans blocks
SHAPES = [(3, 5), (70,), (host_adam.BLOCK + 17,), (1,), (257, 300)]


TINY_DSV3 = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
             "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 16,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
             "ffn_hidden_size": 64, "n_routed_experts": 2, "num_experts_per_tok": 1,
             "moe_intermediate_size": 16, "seq_length": 8}


def kernel():
    k = host_adam_kernel()
    if k is None:  # a machine without a C compiler: the fallback is tested below
        pytest.skip(f"host Adam kernel unavailable: {host_adam_unavailable_reason()}")
    return k


def f32(x):
    return np.float32(x)


def numpy_fp32_step(p, m, v, g, lr, b1, b2, eps, decay, decay_first, l2):
    """host_adam.c's formula, one fp32 numpy op at a time (each op rounds as the C code)."""
    one_b1, one_b2 = f32(1) - f32(b1), f32(1) - f32(b2)
    g = g + f32(l2) * p
    m = m + (g - m) * one_b1
    v = v + (g * g - v) * one_b2
    u = (f32(lr) * m) / (np.sqrt(v) + f32(eps))
    p = p * f32(decay) - u if decay_first else (p - u) * f32(decay)
    return p, m, v


def arrays(seed, shapes=SHAPES, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("decay, decay_first, l2", [(1.0, False, 0.0), (0.99, False, 0.0),
                                                    (2e-4, True, 0.0), (1.0, False, 0.05)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_equals_op_by_op_fp32_reference_bit_for_bit(decay, decay_first, l2, threads,
                                                           monkeypatch):
    monkeypatch.setattr(host_adam, "THREADED_MIN_NUMEL", 1)   # split even this small step
    p0, g = arrays(0), arrays(1)
    m0, v0 = arrays(2, scale=0.1), [np.abs(a) for a in arrays(3, scale=0.01)]
    ps = [Parameter(Tensor(a.copy()), name=f"p{k}") for k, a in enumerate(p0)]
    ms_ = [Parameter(Tensor(a.copy()), name=f"m{k}") for k, a in enumerate(m0)]
    vs = [Parameter(Tensor(a.copy()), name=f"v{k}") for k, a in enumerate(v0)]
    assert kernel().step(ps, ms_, vs, [Tensor(a) for a in g], 1e-3, 0.9, 0.95, 1e-8, decay,
                         decay_first, l2, threads=threads)
    for k in range(len(SHAPES)):
        want = numpy_fp32_step(p0[k], m0[k], v0[k], g[k], 1e-3, 0.9, 0.95, 1e-8, decay,
                               decay_first, l2)
        for got, ref in zip((ps[k], ms_[k], vs[k]), want):
            np.testing.assert_array_equal(got.asnumpy(), ref)


def test_kernel_refuses_what_it_cannot_take_and_touches_nothing():
    k = kernel()
    p = Parameter(Tensor(np.ones((4, 6), np.float32)), name="p")
    m = Parameter(Tensor(np.zeros((4, 6), np.float32)), name="m")
    v = Parameter(Tensor(np.zeros((4, 6), np.float32)), name="v")
    g = Tensor(np.ones((4, 6), np.float32))
    args = (1e-3, 0.9, 0.95, 1e-8)
    assert not k.step([p], [m], [v], [g.astype(ms.float16)], *args)          # not fp32
    assert not k.step([p], [m], [v], [Tensor(np.ones(5, np.float32))], *args)  # sizes
    assert not k.step([p], [m], [v], [g.swapaxes(0, 1)], *args)              # strided
    assert not k.step([p], [m], [v, v], [g], *args)                          # lengths
    np.testing.assert_array_equal(p.asnumpy(), 1.0)
    np.testing.assert_array_equal(m.asnumpy(), 0.0)


def run_adamw(host, steps=4, dtype=ms.float32, **kw):
    rng = np.random.default_rng(0)
    ps = [Parameter(Tensor(a).astype(dtype), name=f"p{k}") for k, a in enumerate(arrays(5))]
    groups = [{"params": ps[:2], "lr_mult": 3.0}, {"params": ps[2:], "wd_mult": 0.5}]
    opt = AdamW(groups, host_kernel=host, **kw)
    for _ in range(steps):
        grads = [Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in ps]
        grads[1] = None if opt.global_step == 2 else grads[1]   # a step without a gradient
        opt.step(grads)
    return [p.astype(ms.float32).asnumpy() for p in ps], opt


@pytest.mark.parametrize("kw", [
    {"lr": 1e-3, "weight_decay": 0.1},
    {"lr": 1e-3, "weight_decay": 0.0},
    {"lr": 1e-3, "weight_decay": 0.1, "decoupled_weight_decay": False},
    {"lr": 0.25, "weight_decay": 1.333},          # lr * wd * lr_mult ~ 1: the decay goes first
    {"lr": 1e-3, "weight_decay": 0.1, "dtype": ms.bfloat16},   # fp32 masters of bf16 params
    {"lr": 1e-3, "weight_decay": 0.1, "dtype": ms.bfloat16, "store_param_remainders": True},
], ids=["adamw", "no_decay", "coupled_l2", "decay_first", "bf16_masters", "remainders"])
def test_adamw_host_path_matches_the_ops_adam_path(kw):
    kernel()
    fast, opt = run_adamw(True, **kw)
    slow, ref = run_adamw(False, **kw)
    assert opt.rule.host is not None and ref.rule.host is None
    for a, b in zip(fast, slow):
        assert rel_err(a, b) < 1e-6
    for k in ("adam_m", "adam_v"):
        for a, b in zip(opt._state[k], ref._state[k]):
            assert rel_err(a.asnumpy(), b.asnumpy()) < 1e-6


def test_adamw_host_path_matches_torch_arithmetic_in_float64():
    kernel()
    rng = np.random.default_rng(3)
    p0 = arrays(7)
    ps = [Parameter(Tensor(a.copy()), name=f"p{k}") for k, a in enumerate(p0)]
    opt = AdamW(ps, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = [(a.astype(np.float64), np.zeros(a.shape), np.zeros(a.shape)) for a in p0]
    for t in range(1, 6):
        grads = [rng.standard_normal(a.shape).astype(np.float32) for a in p0]
        opt.step([Tensor(g) for g in grads])
        ref = [numpy_adamw_step(p, m, v, g, t, 2e-3, 0.9, 0.95, 1e-8, 0.1)
               for (p, m, v), g in zip(ref, grads)]
    for p, (want, _, _) in zip(ps, ref):
        assert rel_err(p.asnumpy(), want) < 1e-6


def test_adamw_host_path_reads_weights_and_moments_replaced_by_set_data():
    """A checkpoint load set_data's parameters and moments; the next step must use them."""
    kernel()
    runs = []
    for host in (True, False):
        ps = [Parameter(Tensor(a), name=f"p{k}") for k, a in enumerate(arrays(8))]
        opt = AdamW(ps, lr=1e-2, weight_decay=0.1, host_kernel=host)
        opt.step([Tensor(a) for a in arrays(9)])
        for p, a in zip(ps, arrays(10)):
            p.set_data(Tensor(a))
        for slot in opt._state["adam_m"]:
            slot.set_data(Tensor(np.full(slot.shape, 0.5, np.float32)))
        opt.step([Tensor(a) for a in arrays(11)])
        runs.append([p.asnumpy() for p in ps])
    for a, b in zip(*runs):
        assert rel_err(a, b) < 1e-6


def test_muon_scalar_branch_uses_one_host_call_and_matches_per_parameter_updates(monkeypatch):
    kernel()
    calls = []
    real = host_adam.HostAdamKernel.step

    def counting(self, masters, *args, **kw):
        calls.append(len(masters))
        return real(self, masters, *args, **kw)

    def run(host):
        rng = np.random.default_rng(1)
        model = build_model(TINY_DSV3, seed=0)
        ps = model.trainable_params()
        opt = Muon(ps, model=model, lr=1e-2, weight_decay=0.1, qk_clip_enabled=False)
        if not host:
            opt.scalar_rule.host = None
        for _ in range(3):
            opt.step([Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in ps])
        return [p.asnumpy() for p in ps], len(opt.adamw_param_names)

    monkeypatch.setattr(host_adam.HostAdamKernel, "step", counting)
    fast, scalars = run(True)
    assert scalars > 5 and calls == [scalars] * 3   # the whole AdamW branch, one call a step
    slow, _ = run(False)
    for a, b in zip(fast, slow):
        assert rel_err(a, b) < 1e-6


def test_disabled_native_kernels_fall_back_to_ops_adam(monkeypatch):
    monkeypatch.setenv("MFC_NATIVE_KERNELS", "0")
    host_adam.reset_host_adam_kernel()
    try:
        assert host_adam_kernel() is None
        assert host_adam_unavailable_reason() == "MFC_NATIVE_KERNELS is off"
        assert host_adam.host_adam_notice() == (
            "host Adam kernel : unavailable (MFC_NATIVE_KERNELS is off); Adam steps use "
            "ops.Adam launches")
        fast, opt = run_adamw(True, lr=1e-3, weight_decay=0.1)
        assert opt.rule.host is None
        slow, _ = run_adamw(False, lr=1e-3, weight_decay=0.1)
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a, b)
    finally:
        monkeypatch.delenv("MFC_NATIVE_KERNELS")
        host_adam.reset_host_adam_kernel()
    assert host_adam_kernel() is not None or host_adam_unavailable_reason()
    assert (host_adam.host_adam_notice() is None) == (host_adam_kernel() is not None)
