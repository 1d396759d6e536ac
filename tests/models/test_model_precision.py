"""params_dtype / compute_dtype: bf16 and fp16 parameters run on CPU."""
import numpy as np
import pytest
import mindspore as ms

from mindformers_core.models import build_model
from mindformers_core.models.precision import resolve_precision
from model_test_utils import T, batch, tiny_dsv3, tiny_gpt


def test_resolve_precision_bf16_compute_is_fp32_on_cpu_only():
    assert resolve_precision("bfloat16", "bfloat16", "CPU").compute == ms.float32
    assert resolve_precision("bfloat16", "bfloat16", "Ascend").compute == ms.bfloat16
    assert resolve_precision("bfloat16", "float32", "Ascend").compute == ms.float32
    assert resolve_precision("float16", "float16", "CPU").compute == ms.float16
    assert resolve_precision("bfloat16", "float32", "CPU").param == ms.bfloat16


@pytest.mark.parametrize("make", [tiny_gpt, tiny_dsv3], ids=["gpt", "dsv3"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_params_run_on_cpu_with_gradients(make, dtype):
    cfg32 = make()
    cfg = make(params_dtype=dtype, compute_dtype=dtype)
    model = build_model(cfg, seed=0)
    ref32 = build_model(cfg32, seed=0)
    params = model.trainable_params()
    assert all(p.dtype == getattr(ms, dtype) for p in params)
    assert model.moe_layers() == {} or all(
        m.router.expert_bias.dtype == ms.float32 for m in model.moe_layers().values())
    ids, labels, mask = batch(cfg)

    def fn(a, b, c):
        loss, n, aux = model(a, b, c)
        return loss / n + aux, n

    (value, _), grads = ms.value_and_grad(fn, None, params, has_aux=True)(T(ids), T(labels), T(mask))
    loss32, n32, _ = ref32(T(ids), T(labels), T(mask))
    # same seed -> the same weights rounded to low precision: close losses
    assert float(value.asnumpy()) == pytest.approx(float((loss32 / n32).asnumpy()), rel=2e-2)
    assert len(grads) == len(params)
    for p, g in zip(params, grads):
        assert g.shape == p.shape
        assert np.all(np.isfinite(g.astype(ms.float32).asnumpy())), p.name
    logits = model.logits(T(ids))
    assert logits.dtype == ms.float32
