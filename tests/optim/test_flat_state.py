"""Packed small tensors (optim/host/flat_state.py): the same bits as per-tensor kernels, also after
a member's data is replaced (checkpoint load), and the packed Parameters share one buffer."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindformers_core.optim.host import flat_state
from mindformers_core.optim.adamw import AdamW
from mindformers_core.optim.host.flat_state import FlatAdamGroup, FlatGroupBuffers, worth_packing

SHAPES = [(40, 8), (7,), (64, 64), (33,), (16, 16)]   # (64, 64) launched alone below


def _params(tag, rng_seed=3):
    rng = np.random.default_rng(rng_seed)
    out = []
    for k, s in enumerate(SHAPES):
        t = Tensor(rng.standard_normal(s).astype(np.float32))
        out.append(Parameter(t.astype(ms.bfloat16) if k == 3 else t, name=f"{tag}{k}"))
    return out


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return [Tensor(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


def _stepped(limit, steps, tag):
    ps = _params(tag)
    opt = AdamW(ps, lr=1e-2, weight_decay=0.1, graph_min_numel=limit, host_kernel=False)
    for step in steps:
        opt.step(_grads(step))
    return ps, opt


def _in_buffer(buffers):
    def inside(param, k):
        base = buffers.host[k].__array_interface__["data"][0]
        addr = param.asnumpy().__array_interface__["data"][0]
        return base <= addr < base + buffers.host[k].nbytes
    return inside


def _state(opt, params):
    return [p.astype(ms.float32).asnumpy().copy() for p in params] + \
        [v for k, v in sorted(opt.state_dict().items()) if k != "global_step"]


@pytest.fixture
def small_pack(monkeypatch):
    monkeypatch.setattr(flat_state, "PACK_MAX_NUMEL", 1024)


def test_packed_group_is_bit_identical_to_per_tensor_kernels(small_pack):
    assert flat_state.synchronous_dispatch()  # tests/conftest.py: as the trainer on CPU
    out = []
    for limit in (1, None):
        ps, opt = _stepped(limit, range(4), "w")
        cells = [c for c in opt._graphs.values() if c is not None]
        assert (limit is None) == (not cells)
        if limit is not None:
            cell = cells[0]
            assert isinstance(cell, FlatAdamGroup)
            assert cell.large == [2] and cell.small == [0, 1, 3, 4]
            inside = _in_buffer(cell.buffers)
            # the optimizer's tensors live in the flat buffers, the model's fp32 params not
            assert not any(inside(ps[j], 0) for j in (0, 1, 4))
            assert inside(opt.main_params[3], 0)
            assert all(inside(opt.state_slots["adam_m"][j], 1) and
                       inside(opt.state_slots["adam_v"][j], 2) for j in (0, 1, 3, 4))
            assert not inside(opt.state_slots["adam_m"][2], 1)   # launched alone
        out.append(_state(opt, ps))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


def test_replaced_member_data_is_copied_back_in(small_pack):
    """A checkpoint load set_data()s parameters and moments: the next step re-attaches them,
    with the same result as the per-tensor path after the same load."""
    out = []
    for limit in (1, None):
        ps, opt = _stepped(limit, range(3), "r")
        sd = opt.state_dict()
        sd = {k: (v * 0.5 if isinstance(v, np.ndarray) else v) for k, v in sd.items()}
        opt.load_state_dict(sd)
        ps[0].set_data(Tensor(np.full(SHAPES[0], 0.25, np.float32)))
        for step in range(3, 5):
            opt.step(_grads(step))
        out.append(_state(opt, ps))
    for a, b in zip(*out):
        np.testing.assert_array_equal(a, b)


class _Total(nn.Cell):
    def __init__(self, w):
        super().__init__()
        self.w = w

    @ms.jit
    def construct(self):
        return (self.w * 1.0).sum()


def test_compiled_graph_reading_a_packed_parameter_sees_its_updates(small_pack):
    """A jit function compiled before packing (as under training.jit) keeps reading the
    parameter's own buffer, so that buffer must hold the updated values."""
    ps = _params("j")
    total = _Total(ps[0])
    before = float(total().asnumpy())
    opt = AdamW(ps, lr=1e-2, weight_decay=0.1, graph_min_numel=1, host_kernel=False)
    for step in range(3):
        opt.step(_grads(step))
    assert isinstance(opt._graphs[tuple(range(len(ps)))], FlatAdamGroup)
    after = float(total().asnumpy())
    assert after != before
    assert after == pytest.approx(float(ps[0].asnumpy().astype(np.float64).sum()), rel=1e-5)


def test_buffers_share_memory_and_survive_the_owner():
    p = Parameter(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), name="a")
    q = Parameter(Tensor(np.ones(4, np.float32)), name="b")
    buffers = FlatGroupBuffers([[p, q]], "t")
    np.testing.assert_array_equal(buffers.host[0], [0, 1, 2, 3, 4, 5, 1, 1, 1, 1])
    buffers.host[0][0] = 9.0                       # written through the buffer ...
    assert float((p * 1).asnumpy()[0, 0]) == 9.0   # ... a kernel reads it from p
    del buffers
    junk = [np.full(10, 7.0, np.float32) for _ in range(100)]  # noqa: F841
    np.testing.assert_array_equal((q * 1).asnumpy(), np.ones(4, np.float32))


def test_worth_packing_needs_two_small_tensors():
    big = flat_state.PACK_MAX_NUMEL
    assert not worth_packing([big, 5])
    assert worth_packing([big, 5, 6])
    assert not worth_packing([big, big])
