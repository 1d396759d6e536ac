"""enable_cpu_offload (optim/state_offload.py): the device path, run on CPU with host ==
device, changes no bit of the parameters, masters or moments; the refusals name the cause."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.optim.adamw import AdamW
from mindformers_core.optim.state_offload import (HostStateOffload, check_offload_context,
                                                  cpu_offload_for)

SHAPES = [(300, 300), (300,), (40, 8), (8,)]   # one group above graph_min_numel


def _params(tag):
    rng = np.random.default_rng(5)
    return [Parameter(Tensor(rng.standard_normal(s).astype(np.float32)).astype(
        ms.bfloat16 if k == 2 else ms.float32), name=f"{tag}{k}") for k, s in enumerate(SHAPES)]


def _grads(steps=4):
    rng = np.random.default_rng(6)
    out = [[Tensor(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]
           for _ in range(steps)]
    out[2][3] = None   # a parameter without a gradient is skipped
    return out


def _opt(ps, offload, **kw):
    groups = [{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}]
    return AdamW(groups, lr=1e-2, weight_decay=0.1, state_offload=offload, **kw)


def _run(offload, steps=4, **kw):
    ps = _params("o")
    opt = _opt(ps, offload, **kw)
    for grads in _grads()[:steps]:
        opt.step(grads)
    return opt, [p.astype(ms.float32).asnumpy() for p in ps]


@pytest.mark.parametrize("kw", [{}, {"impl": "reference"},
                                {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}])
def test_device_path_on_cpu_is_bit_identical(kw):
    plain, p_plain = _run(None, **kw)
    moved, p_moved = _run(HostStateOffload(device="CPU"), **kw)
    assert moved.state_offload is not None and plain.state_offload is None
    for a, b in zip(p_plain, p_moved):
        np.testing.assert_array_equal(a, b)
    sd_plain, sd_moved = plain.state_dict(), moved.state_dict()
    assert sorted(sd_plain) == sorted(sd_moved)   # same checkpoint layout
    for key, value in sd_plain.items():
        np.testing.assert_array_equal(value, sd_moved[key])


def test_resume_with_offload_is_bit_exact():
    """state_dict after 2 steps -> a new optimizer loads it -> 2 more steps == 4 steps."""
    _, p_full = _run(HostStateOffload(device="CPU"), steps=4)
    half, _ = _run(HostStateOffload(device="CPU"), steps=2)
    ps = _params("o")
    for p, src in zip(ps, half.parameters):
        p.set_data(src.astype(p.dtype))
    resumed = _opt(ps, HostStateOffload(device="CPU"))
    resumed.load_state_dict(half.state_dict())
    for grads in _grads()[2:]:
        resumed.step(grads)
    for a, b in zip(p_full, [p.astype(ms.float32).asnumpy() for p in ps]):
        np.testing.assert_array_equal(a, b)


def test_enable_cpu_offload_on_cpu_moves_nothing():
    assert cpu_offload_for(True, "CPU") is None
    assert cpu_offload_for(False, "Ascend") is None
    opt = AdamW(_params("c"), enable_cpu_offload=True)
    assert opt.enable_cpu_offload and opt.state_offload is None


def test_enable_cpu_offload_on_a_device_builds_the_offload():
    offload = cpu_offload_for(True, "Ascend")
    assert isinstance(offload, HostStateOffload)
    assert (offload.device, offload.host) == ("Ascend", "CPU")


def test_offload_refusals():
    with pytest.raises(ValueError, match=r"enable_cpu_offload: unknown device 'NPU'; "
                                         r"expected one of \['Ascend', 'GPU', 'CPU'\]"):
        HostStateOffload(device="NPU")
    with pytest.raises(ValueError, match=r"enable_cpu_offload needs PyNative mode \(mode: 1\)"):
        check_offload_context("Ascend", ms.GRAPH_MODE)
    check_offload_context("Ascend", ms.PYNATIVE_MODE)


def test_moments_go_back_to_host_when_the_update_raises():
    offload = HostStateOffload(device="CPU")
    moved = []
    offload.park = lambda tensors: moved.append(len(tensors))
    with pytest.raises(RuntimeError, match="boom"):
        with offload.on_device([Parameter(Tensor(np.zeros(2, np.float32)), name="s")]):
            raise RuntimeError("boom")
    assert moved == [1]
