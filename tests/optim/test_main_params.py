"""fp32 masters for bf16 params, remainders, state_dict round trip, embedding_min_norm."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.optim.adamw import AdamW
from mindformers_core.optim.main_params import (merge_bf16_and_remainder,
                                                split_fp32_to_bf16_and_remainder)


def bf16_param(value, shape=(4,), name="w"):
    return Parameter(Tensor(np.full(shape, value, np.float32)).astype(ms.bfloat16), name=name)


@pytest.mark.parametrize("remainders", [False, True])
def test_bf16_param_moves_through_master(remainders):
    p = bf16_param(1.0)
    opt = AdamW([p], lr=1e-4, weight_decay=0.0, store_param_remainders=remainders)
    g = Tensor(np.full((4,), -1.0, np.float32))  # Adam step = +lr per step (normalised)
    for _ in range(40):
        opt.step([g])
    master = opt.main_params[0].asnumpy()
    # the master holds the exact sum (fp32 rounding only); bf16 spacing at 1.0 is 2^-7
    np.testing.assert_allclose(master, 1.0 + 40 * 1e-4, rtol=2e-6)
    assert np.all(p.astype(ms.float32).asnumpy() > 1.0)  # the bf16 value changed (1.0 -> 1.0078)


def test_without_master_bf16_would_not_move():
    # Reference: rounding 1.0 + 1e-4 to bf16 every step gives 1.0 forever.
    v = np.float32(1.0)
    for _ in range(40):
        v = Tensor(np.array([v + np.float32(1e-4)])).astype(ms.bfloat16).astype(ms.float32).asnumpy()[0]
    assert v == 1.0


def test_main_params_names_and_identity():
    w32 = Parameter(Tensor(np.ones(3, np.float32)), name="a")
    w16 = bf16_param(2.0, name="b")
    opt = AdamW([w32, w16])
    assert opt.main_params[0] is w32
    assert opt.main_params[1].name == "main_param.b"
    assert opt.main_params[1].dtype == ms.float32
    sd = opt.state_dict()
    assert "main_param.b" in sd and "main_param.a" not in sd
    assert set(sd) == {"global_step", "main_param.b", "adam_m.a", "adam_m.b", "adam_v.a",
                       "adam_v.b"}


@pytest.mark.parametrize("remainders", [False, True])
def test_state_dict_round_trip_bit_for_bit_and_continues(remainders):
    rng = np.random.default_rng(0)
    init = rng.standard_normal((6, 4)).astype(np.float32)
    grads = [Tensor(rng.standard_normal((6, 4)).astype(np.float32)) for _ in range(6)]

    def fresh():
        return [Parameter(Tensor(init).astype(ms.bfloat16), name="w"),
                Parameter(Tensor(init[0]), name="b")]

    a = fresh()
    oa = AdamW(a, lr=1e-2, weight_decay=0.1, store_param_remainders=remainders)
    for g in grads[:3]:
        oa.step([g, g[0]])
    sd = oa.state_dict()
    b = fresh()
    b[0].set_data(a[0] * 1)  # the model checkpoint restores the params
    b[1].set_data(a[1] * 1)
    ob = AdamW(b, lr=1e-2, weight_decay=0.1, store_param_remainders=remainders)
    ob.load_state_dict(sd)
    sd2 = ob.state_dict()
    assert sd2.keys() == sd.keys() and sd2["global_step"] == 3
    for k in sd:
        np.testing.assert_array_equal(sd2[k], sd[k])
    for g in grads[3:]:
        oa.step([g, g[0]])
        ob.step([g, g[0]])
    for x, y in zip(oa.main_params, ob.main_params):
        np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())
    np.testing.assert_array_equal(a[0].astype(ms.float32).asnumpy(),
                                  b[0].astype(ms.float32).asnumpy())


def test_load_without_master_reloads_from_model():
    p = bf16_param(3.0)
    opt = AdamW([p])
    opt.step([Tensor(np.ones(4, np.float32))])
    sd = opt.state_dict()
    del sd["main_param.w"]
    p.set_data(Tensor(np.full(4, 5.0, np.float32)).astype(ms.bfloat16))
    opt.load_state_dict(sd)
    np.testing.assert_array_equal(opt.main_params[0].asnumpy(), np.full(4, 5.0, np.float32))


def test_load_errors():
    opt = AdamW([Parameter(Tensor(np.ones(3, np.float32)), name="a")])
    with pytest.raises(KeyError, match="has no 'global_step'"):
        opt.load_state_dict({})
    with pytest.raises(ValueError, match=r"'adam_m.a' has shape \(2,\), expected \(3,\)"):
        opt.load_state_dict({"global_step": 1, "adam_m.a": np.zeros(2, np.float32)})


def test_remainder_split_merge_exact():
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    x = np.concatenate([x, np.float32([0.0, -0.0, 1.0, 1e-30, 3.4e38])])
    high, rem = split_fp32_to_bf16_and_remainder(x)
    assert rem.dtype == np.int16
    np.testing.assert_array_equal(high.view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(merge_bf16_and_remainder(high, rem).view(np.uint32),
                                  x.view(np.uint32))
    # the high half is within half a bf16 ulp of x (rounded, not truncated)
    fin = np.abs(x) < 3e38  # 3.4e38 rounds up to inf in bf16 (still restored exactly above)
    err = np.abs(high[fin].astype(np.float64) - x[fin])
    assert np.all(err <= np.abs(x[fin]) * 2.0 ** -8 + 1e-38)


def test_embedding_min_norm_rescales_small_rows():
    emb = np.array([[0.0, 0.0], [0.03, 0.04], [3.0, 4.0]], np.float32)
    w = Parameter(Tensor(emb), name="embedding.word_embeddings.weight")
    other = Parameter(Tensor(np.full((1, 2), 0.01, np.float32)), name="output_layer.weight")
    opt = AdamW([w, other], lr=0.0, weight_decay=0.0, embedding_min_norm=0.1)
    zero = Tensor(np.zeros((3, 2), np.float32))
    opt.step([zero, Tensor(np.zeros((1, 2), np.float32))])
    out = w.asnumpy()
    np.testing.assert_array_equal(out[0], [0.0, 0.0])           # zero row untouched
    np.testing.assert_allclose(out[1], [0.12, 0.16], rtol=1e-6)  # norm 0.05 -> 0.2
    np.testing.assert_array_equal(out[2], [3.0, 4.0])
    np.testing.assert_allclose(other.asnumpy(), 0.01)           # not an input embedding


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_bf16_master_zero_grad_decay(impl):
    p = bf16_param(1.5, shape=(3, 2))
    opt = AdamW([p], lr=0.1, weight_decay=0.2, impl=impl)
    opt.step([Tensor(np.zeros((3, 2), np.float32))])
    np.testing.assert_allclose(opt.main_params[0].asnumpy(), 1.5 * (1 - 0.02), rtol=1e-6)
    want_bf16 = Tensor(np.full((3, 2), 1.5 * 0.98, np.float32)).astype(ms.bfloat16)
    np.testing.assert_array_equal(p.astype(ms.float32).asnumpy(),
                                  want_bf16.astype(ms.float32).asnumpy())


def test_bf16_moments_round_trip_bit_for_bit():
    rng = np.random.default_rng(2)
    g = Tensor(rng.standard_normal((5, 3)).astype(np.float32))
    kw = dict(lr=1e-2, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    a = [Parameter(Tensor(np.ones((5, 3), np.float32)), name="w")]
    oa = AdamW(a, **kw)
    oa.step([g])
    b = [Parameter(Tensor(a[0].asnumpy().copy()), name="w")]
    ob = AdamW(b, **kw)
    ob.load_state_dict(oa.state_dict())
    assert ob._state["adam_m"][0].dtype == ms.bfloat16
    oa.step([g])
    ob.step([g])
    np.testing.assert_array_equal(a[0].asnumpy(), b[0].asnumpy())


def test_numpy_fast_paths_equal_mindspore_fallback(monkeypatch):
    """In-place numpy decay/writeback (CPU buffer views) == set_data/Cast fallback, bitwise."""
    from mindformers_core.optim.host import views as base
    rng = np.random.default_rng(7)
    init = rng.standard_normal((16, 8)).astype(np.float32)
    grads = [Tensor(rng.standard_normal((16, 8)).astype(np.float32)) for _ in range(4)]

    def run():
        ps = [Parameter(Tensor(init).astype(ms.bfloat16), name="a"),
              Parameter(Tensor(init), name="b")]
        opt = AdamW(ps, lr=1e-2, weight_decay=0.1)
        for g in grads:
            opt.step([g, g])
        return [p.astype(ms.float32).asnumpy() for p in ps] + [opt.main_params[0].asnumpy()]

    fast = run()
    assert base.numpy_view_aliases_storage() and base.numpy_view_aliases_storage(True)
    monkeypatch.setattr(base, "_ALIASES", {"fp32": False, "low": False})
    slow = run()
    for x, y in zip(fast, slow):
        np.testing.assert_array_equal(x, y)


def _ms_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Independent reference: MindSpore's own Cast fp32 -> bf16, as uint16 bit patterns."""
    return Tensor(x).astype(ms.bfloat16).asnumpy().view(np.uint16)


def test_fp32_to_bf16_bits_matches_mindspore_cast_on_edge_cases():
    from mindformers_core.optim.main_params import fp32_to_bf16_bits
    bits = np.array([
        0x3F808000,  # tie, even high half -> stays 0x3F80
        0x3F818000,  # tie, odd high half -> rounds up to 0x3F82
        0x3F808001,  # just above a tie -> up
        0x3F807FFF,  # just below a tie -> down
        0x7F7FFFFF,  # largest finite -> rounds to +inf
        0xFF7F8000,  # negative tie at the top -> -inf (odd high half rounds up)
        0x7F800000, 0xFF800000,  # +-inf
        0x00000001, 0x80008000, 0x00018000,  # denormals, incl. ties
        0x00000000, 0x80000000,  # +-0
    ], dtype=np.uint32)
    rng = np.random.default_rng(3)
    finite = rng.standard_normal(4096).astype(np.float32) * np.float32(1e3)
    src = np.concatenate([bits.view(np.float32), finite])
    out = np.zeros(src.size, np.uint16)
    fp32_to_bf16_bits(src, out, np.empty(src.size, np.uint32))
    np.testing.assert_array_equal(out, _ms_bf16_bits(src))


def test_fp32_to_bf16_bits_block_with_nan_keeps_nan():
    """NaN payloads would carry into sign/exponent in the integer formula: the block takes
    the dtype cast instead, and every element still matches MindSpore's Cast."""
    from mindformers_core.optim.main_params import fp32_to_bf16_bits
    nans = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7F800001, 0x7FC00000], np.uint32).view(np.float32)
    src = np.concatenate([nans, np.array([1.0, 0.5, -3.25], np.float32)])
    out = np.zeros(src.size, np.uint16)
    fp32_to_bf16_bits(src, out, np.empty(src.size, np.uint32))
    back = out.view(Tensor(np.zeros(1, np.float32)).astype(ms.bfloat16).asnumpy().dtype)
    assert np.isnan(back[:4].astype(np.float32)).all()
    np.testing.assert_array_equal(out, _ms_bf16_bits(src))


def test_scale_and_cast_blocked_equals_multiply_then_cast(monkeypatch):
    """Many small blocks over two threads, bf16 and fp16 targets, an fp32-only master and a
    strided target: same bits as numpy's multiply followed by MindSpore's Cast."""
    from mindformers_core.optim import main_params as mp
    monkeypatch.setattr(mp, "BLOCK", 64)
    monkeypatch.setattr(mp, "_workers", lambda: 2)
    rng = np.random.default_rng(5)
    factor = 0.999
    masters = [rng.standard_normal(n).astype(np.float32) for n in (1000, 333, 500, 64)]
    want = [m * np.float32(factor) for m in masters]
    bf16 = mp._bf16_dtype()
    strided = np.zeros(128, bf16)
    targets = [np.zeros(1000, bf16), np.zeros(333, np.float16), None, strided[::2]]
    mp.scale_and_cast_blocked(list(zip(masters, targets)), factor)
    for m, w in zip(masters, want):
        np.testing.assert_array_equal(m, w)
    np.testing.assert_array_equal(targets[0].view(np.uint16), _ms_bf16_bits(want[0]))
    np.testing.assert_array_equal(
        targets[1], Tensor(want[1]).astype(ms.float16).asnumpy())
    np.testing.assert_array_equal(targets[3].view(np.uint16), _ms_bf16_bits(want[3]))
    assert not strided[1::2].view(np.uint16).any()  # the gaps of the strided view untouched


def test_blocked_threaded_step_equals_mindspore_fallback(monkeypatch):
    """A group that runs the compiled graph and the threaded blocked epilogue (tiny blocks)
    gives the same bits as the set_data/Cast fallback for fp32, bf16 and fp16 params."""
    from mindformers_core.optim import main_params as mp
    from mindformers_core.optim.host import views as base
    rng = np.random.default_rng(8)
    init = rng.standard_normal((3, 40, 8)).astype(np.float32)
    grads = [[Tensor(rng.standard_normal((40, 8)).astype(np.float32)) for _ in range(3)]
             for _ in range(3)]

    def run():
        ps = [Parameter(Tensor(init[0]).astype(ms.bfloat16), name="a"),
              Parameter(Tensor(init[1]).astype(ms.float16), name="b"),
              Parameter(Tensor(init[2]), name="c")]
        opt = AdamW(ps, lr=1e-2, weight_decay=0.1, graph_min_numel=1, host_kernel=False)
        for g in grads:
            opt.step(g)
        assert any(c is not None for c in opt._graphs.values())
        return [p.astype(ms.float32).asnumpy() for p in ps] + \
            [m.asnumpy().copy() for m in opt.main_params]

    monkeypatch.setattr(mp, "BLOCK", 32)
    monkeypatch.setattr(mp, "_workers", lambda: 2)
    fast = run()
    monkeypatch.setattr(base, "_ALIASES", {"fp32": False, "low": False})
    slow = run()
    for x, y in zip(fast, slow):
        np.testing.assert_array_equal(x, y)


def test_fallback_graph_survives_decay_first_step(monkeypatch):
    """Without aliased views (device memory) the graph decays in place; a step with
    lr*wd = 1 (decay first, masters replaced by set_data) must not leave a graph bound to
    stale buffers: later steps still match the plain reference path."""
    from mindformers_core.optim.host import views as base
    monkeypatch.setattr(base, "_ALIASES", {"fp32": False, "low": False})
    rng = np.random.default_rng(21)
    init = rng.standard_normal((2, 16, 8)).astype(np.float32)
    grads = [[Tensor(rng.standard_normal((16, 8)).astype(np.float32)) for _ in range(2)]
             for _ in range(4)]
    out = []
    for impl in ("fused", "reference"):
        ps = [Parameter(Tensor(init[0]), name="f"),
              Parameter(Tensor(init[1]).astype(ms.bfloat16), name="h")]
        opt = AdamW(ps, lr=1e-2, weight_decay=0.1, impl=impl, graph_min_numel=1, host_kernel=False)
        for k, g in enumerate(grads):
            opt.set_lr(10.0 if k == 1 else 1e-2)  # step 2: lr*wd = 1 -> decay-first branch
            opt.step(g)
        out.append([m.asnumpy().copy() for m in opt.main_params])
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
