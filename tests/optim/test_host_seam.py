"""optim/host/seam.py: one choice of host kernels, made at optimizer build, read by every
consumer, described in one line (issue 29: the host kernels behind one seam)."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.optim.build import build_optimizer
from mindformers_core.optim.clip_grad import clip_by_norm, global_grad_norm
from mindformers_core.optim.host import accumulate as host_accumulate
from mindformers_core.optim.host import adam as host_adam
from mindformers_core.optim.host import norm as host_norm
from mindformers_core.optim.host.seam import HostKernels, host_kernels, select_host_kernels
from mindformers_core.optim.host.views import numpy_view_aliases_storage

RESETS = (host_adam.reset_host_adam_kernel, host_norm.reset_host_norm,
          host_accumulate.reset_host_add_kernel)


@pytest.fixture
def host():
    choice = select_host_kernels()
    if not numpy_view_aliases_storage() or choice.fallbacks:
        pytest.skip(f"the host kernels do not run here ({choice.fallbacks})")
    return choice


@pytest.fixture
def kernels_off(monkeypatch):
    monkeypatch.setenv("MFC_NATIVE_KERNELS", "0")
    yield monkeypatch
    monkeypatch.delenv("MFC_NATIVE_KERNELS")
    for reset in RESETS:
        reset()


def tiny_model():
    from mindformers_core.models.build import build_model
    return build_model({"vocab_size": 64, "hidden_size": 16, "num_layers": 1,
                        "num_attention_heads": 2, "seq_length": 8}, seed=0)


def test_the_choice_made_at_optimizer_build_is_what_every_consumer_reads(host):
    opt = build_optimizer({"type": "AdamW"}, tiny_model())
    choice = host_kernels()
    assert isinstance(choice, HostKernels) and host_kernels() is choice
    assert opt.rule.host is choice.adam is not None and choice.accumulate is not None
    assert choice.norm and choice.fallbacks == {}
    assert choice.describe() == ("host kernels     : Adam, norm, accumulate, scale in host C "
                                 "(optim/host)")
    grads = [ms.Tensor(np.full((3, 4), 2.0, np.float32)), None]
    assert choice.sq_norm(grads) == 48.0 and global_grad_norm(grads) == pytest.approx(48 ** .5)
    scaled, clipped = clip_by_norm(grads, 48 ** .5, 1.0)
    assert clipped and scaled[1] is None
    np.testing.assert_array_equal(scaled[0].asnumpy(), choice.scaled(grads, 1.0 / (
        48 ** .5 + 1e-6))[0].asnumpy())


def test_every_kernel_off_names_the_mindspore_fallback_and_why(kernels_off):
    for reset in RESETS:
        reset()
    opt = build_optimizer({"type": "AdamW"}, tiny_model())
    choice = host_kernels()
    assert opt.rule.host is None and choice.adam is None and choice.accumulate is None
    assert choice.sq_norm([ms.Tensor(np.ones(3, np.float32))]) is None
    assert choice.scaled([ms.Tensor(np.ones(3, np.float32))], 0.5) is None
    if numpy_view_aliases_storage():
        assert choice.describe() == ("host kernels     : MindSpore fallback for Adam, norm, "
                                     "accumulate, scale (MFC_NATIVE_KERNELS is off)")
    else:
        assert choice.describe() is None
    assert global_grad_norm([ms.Tensor(np.full(4, 3.0, np.float32))]) == pytest.approx(6.0)


def test_one_kernel_off_is_named_alone(host, kernels_off):
    host_norm.reset_host_norm()      # only the norm is asked again, with kernels switched off
    choice = host_kernels()
    assert choice is not host and choice.adam is host.adam and not choice.norm
    assert choice.fallbacks == {"norm": "MFC_NATIVE_KERNELS is off"}
    assert choice.describe() == ("host kernels     : Adam, accumulate, scale in host C "
                                 "(optim/host); MindSpore fallback for norm "
                                 "(MFC_NATIVE_KERNELS is off)")


def test_different_reasons_are_named_per_kernel():
    choice = HostKernels(None, True, None, {"Adam": "no C compiler ('cc' not found)",
                                            "accumulate": "x", "scale": "x"},
                         ("cache /c/native not writable (Read-only file system); built in /t",))
    assert choice.describe() == (
        "host kernels     : norm in host C (optim/host); MindSpore fallback for Adam (no C "
        "compiler ('cc' not found)); accumulate, scale (x); cache /c/native not writable "
        "(Read-only file system); built in /t")
