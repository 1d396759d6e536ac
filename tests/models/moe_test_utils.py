"""Helpers of the MoE layer tests: a standalone MoE layer with random weights, its numpy
parameters, and the test objective sum(out * R) + aux."""
import numpy as np
import mindspore as ms

from mindformers_core.models.moe import MoE, MoESpec
from mindformers_core.models.precision import resolve_precision
from model_test_utils import tiny_dsv3

H = 8


def moe_cfg(**kw):
    base = dict(hidden_size=H, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
                routed_scaling_factor=1.5, moe_aux_loss_coeff=0.1)
    base.update(kw)
    return tiny_dsv3(**base)


def build_layer(cfg, seed=0, bias_scale=0.05):
    """MoE layer of ``cfg`` with N(0, 0.5) weights and a random selection bias."""
    layer = MoE(cfg.hidden_size, MoESpec.from_model_config(cfg),
                resolve_precision("float32", "float32"))
    rng = np.random.RandomState(seed)
    for p in layer.get_parameters():
        scale = bias_scale if p.name.endswith("expert_bias") else 0.5
        p.set_data(ms.Tensor((rng.standard_normal(p.shape) * scale).astype(np.float32)))
    return layer


def layer_params(layer, prefix=""):
    """prefix + name -> float64 copy (the names a numpy reference reads)."""
    return {prefix + p.name: p.asnumpy().astype(np.float64) for p in layer.get_parameters()}


def inputs(b=2, s=5, seed=1):
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((b, s, H)).astype(np.float32)
    r = rng.standard_normal((b, s, H)).astype(np.float32)
    return x, r


def objective(layer, r):
    """f(x) = sum(layer(x) * r) + aux (0 when there is none)."""
    rt = ms.Tensor(r)

    def f(x):
        out, aux = layer(x)
        total = (out * rt).sum()
        return total if aux is None else total + aux
    return f
