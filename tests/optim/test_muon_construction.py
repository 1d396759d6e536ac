"""Muon construction checks: every message, in upstream MindFormers' order."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor

from mindformers_core.models.build import build_model
from mindformers_core.optim.muon import Muon

TINY = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 1,
        "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "ffn_hidden_size": 64, "seq_length": 8}


@pytest.fixture(scope="module")
def mla():
    return build_model(TINY, seed=0)


@pytest.fixture(scope="module")
def params(mla):
    return mla.trainable_params()


class LegacyModel:
    """A model that reports itself as a legacy (non-mcore) implementation."""

    def __init__(self, model):
        self._model = model

    def is_legacy_model(self):
        return True

    def get_gpt_transformer_config(self):
        return self._model.get_gpt_transformer_config()


def test_defaults_build(mla, params):
    opt = Muon(params, model=mla)
    assert opt.ns_steps == 5 and len(opt.ns_schedule) == 5
    assert opt.ns_eps == 1e-7 and opt.adamw_betas == (0.95, 0.95) and opt.adamw_eps == 1e-8
    assert opt.comm_strategy == "allgather" and opt.qk_clip_threshold == 100.0
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.momentum == 0.95
    assert opt.ns_dtype == ms.float32


@pytest.mark.parametrize("name", ["phase0_batch_memory_gb", "ns_batch_memory_gb",
                                  "phase4_batch_memory_gb"])
def test_memory_budgets(mla, params, name):
    with pytest.raises(TypeError, match=f"{name} must be a number of GB, but got bool."):
        Muon(params, model=mla, **{name: True})
    with pytest.raises(ValueError, match=f"{name} must be positive, but got 0."):
        Muon(params, model=mla, **{name: 0})
    opt = Muon(params, model=mla, **{name: 0.5})
    # only the Newton-Schulz budget is used (it caps one batched NS call); the default is 1 GB
    assert opt.ns_batch_memory_bytes == (2 ** 29 if name == "ns_batch_memory_gb" else 2 ** 30)


def test_swap_is_refused_before_the_model_checks(params):
    with pytest.raises(ValueError, match="^Muon does not support swap.$"):
        Muon(params, model=None, swap=True)


def test_model_checks(mla, params):
    with pytest.raises(ValueError, match="^Model must be provided for Muon optimizer.$"):
        Muon(params)
    with pytest.raises(ValueError, match="^Muon does not support Legacy Model.$"):
        Muon(params, model=LegacyModel(mla))
    gpt = build_model({"model_type": "gpt", "vocab_size": 64, "hidden_size": 32, "num_layers": 1,
                       "num_attention_heads": 2, "seq_length": 8}, seed=0)
    with pytest.raises(ValueError, match="^Current Muon implementation only supports models with "
                                         "Multi-Latent Attention enabled.$"):
        Muon(gpt.trainable_params(), model=gpt)


def test_model_is_checked_before_the_schedule_and_comm_strategy(params):
    with pytest.raises(ValueError, match="Model must be provided"):
        Muon(params, ns_coefficients=[1.0, 2.0], comm_strategy="p2p")


@pytest.mark.parametrize("coeffs, steps, message", [
    (3.0, 5, "ns_coefficients must be a non-empty list/tuple, got 3.0."),
    ([], 5, r"ns_coefficients must be a non-empty list/tuple, got \[\]."),
    ([1.0, 2.0], 5, r"flat ns_coefficients must have 3 elements, got \[1.0, 2.0\]."),
    ([3.4445, -4.775, 2.0315], 0, "ns_steps must be positive, got 0."),
    ([[[1.0, 2.0, 3.0]]], 5, r"segmented ns_coefficients entry 0 must be \[\[a, b, c\], count\]"),
    ([[[1.0, 2.0], 3]], 5, "segmented ns_coefficients entry 0 must hold a 3-element triple"),
    ([[[1.0, 2.0, 3.0], 0]], 5, "segmented ns_coefficients entry 0 count must be positive, got 0."),
    ([True, 1.0, 2.0], 5, "segmented ns_coefficients entry 0 must be"),
])
def test_ns_schedule_messages(mla, params, coeffs, steps, message):
    with pytest.raises(ValueError, match=message):
        Muon(params, model=mla, ns_coefficients=coeffs, ns_steps=steps)


def test_segmented_schedule_sets_the_step_count(mla, params):
    opt = Muon(params, model=mla, ns_steps=5,
               ns_coefficients=[[[3.4445, -4.775, 2.0315], 8], [[2.0, -1.5, 0.5], 2]])
    assert opt.ns_steps == 10 and opt.ns_schedule[-1] == (2.0, -1.5, 0.5)


def test_named_preset(mla, params):
    opt = Muon(params, model=mla, muon_coefficient_type="quintic")
    assert opt.ns_schedule[0] == (4.0848, -6.8946, 2.9270)
    with pytest.raises(ValueError, match="set either muon_coefficient_type"):
        Muon(params, model=mla, muon_coefficient_type="quintic", ns_coefficients=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="preset 'quintc'"):
        Muon(params, model=mla, muon_coefficient_type="quintc")


def test_qk_clip_threshold(mla, params):
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=f"qk_clip_threshold must be positive, got {bad!r}."):
            Muon(params, model=mla, qk_clip_threshold=bad)
    Muon(params, model=mla, qk_clip_threshold=0, qk_clip_enabled=False)  # only checked when on


def test_adamw_include_must_be_globs(mla, params):
    with pytest.raises(ValueError, match="^adamw_include must be a list of glob strings.$"):
        Muon(params, model=mla, adamw_include=["*norm*", 3])


def test_three_d_weight_that_is_not_an_expert_is_rejected_at_construction(mla, params):
    odd = Parameter(Tensor(np.zeros((2, 3, 4), np.float32)), name="decoder.layers.0.odd.weight")
    with pytest.raises(ValueError, match=r"Muon only supports 3D weights from grouped experts "
                                         r"\(`\*.experts.weight1/weight2`, `\*.experts.weight`\), "
                                         r"but got "
                                         r"param='decoder.layers.0.odd.weight', shape=\(2, 3, 4\)"):
        Muon(list(params) + [odd], model=mla)
    four = Parameter(Tensor(np.zeros((1, 2, 3, 4), np.float32)), name="conv.weight")
    with pytest.raises(ValueError, match="Muon only supports 2D weights and grouped 3D expert "
                                         "weights, but got param='conv.weight'"):
        Muon(list(params) + [four], model=mla)
    # routed to AdamW by adamw_include, the odd 3-D weight is fine
    Muon(list(params) + [odd], model=mla, adamw_include=["*odd*"])


def test_comm_strategy(mla, params):
    with pytest.raises(ValueError, match="^comm_strategy must be 'allgather' or "
                                         "'allgather_deredundency', got 'p2p'.$"):
        Muon(params, model=mla, comm_strategy="p2p")
    assert Muon(params, model=mla, comm_strategy="allgather_deredundency").comm_strategy == \
        "allgather_deredundency"


def test_qk_threshold_is_checked_before_comm_strategy(mla, params):
    with pytest.raises(ValueError, match="qk_clip_threshold must be positive"):
        Muon(params, model=mla, qk_clip_threshold=-1, comm_strategy="p2p")


@pytest.mark.parametrize("kwargs, message", [
    ({"momentum": 1.0}, r"momentum must be in \[0, 1\), got 1.0."),
    ({"matched_adamw_rms": 0.0}, "matched_adamw_rms must be positive, got 0.0."),
    ({"muon_scale_mode": "rms"}, "muon_scale_mode must be one of"),
    ({"muon_extra_scale_factor": 0.0}, "muon_extra_scale_factor must be positive"),
    ({"muon_scalar_optimizer": "sgd"}, "muon_scalar_optimizer must be 'adam' or 'lion', got 'sgd'."),
    ({"adamw_lr_mult": -0.1}, "adamw_lr_mult must be >= 0"),
    ({"lion_betas": (0.9,)}, "lion_betas must be two values"),
    ({"ns_dtype": "float16"}, "ns_dtype must be None, 'float32' or 'bfloat16'"),
    ({"ns_dtype": "bfloat16"}, "ns_dtype bfloat16 needs Ascend"),
])
def test_extra_knobs(mla, params, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Muon(params, model=mla, **kwargs)


def test_adamw_branch_arguments_are_validated(mla, params):
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.0"):
        Muon(params, model=mla, adamw_betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Invalid epsilon value: -1.0"):
        Muon(params, model=mla, adamw_eps=-1.0)
    Muon(params, model=mla, weight_decay=0, adamw_betas=[0, 0.95])  # YAML ints are accepted


SEED_4_2 = {"type": "Muon", "weight_decay": 0.1, "momentum": 0.95, "matched_adamw_rms": 0.2,
            "nesterov": True, "eps": 1.0e-7, "ns_steps": 5,
            "ns_coefficients": [3.4445, -4.7750, 2.0315], "adamw_betas": [0.95, 0.95],
            "adamw_eps": 1.0e-8, "qk_clip_enabled": True, "qk_clip_threshold": 100,
            "comm_strategy": "allgather"}


def test_build_optimizer_from_the_seed_yaml(mla):
    from mindformers_core.config.optimizer import OptimizerConfig
    from mindformers_core.optim.build import OPTIMIZERS, build_optimizer
    section = dict(SEED_4_2, adamw_lr_mult=0.15, ns_coefficients=[[[3.4445, -4.775, 2.0315], 8],
                                                                  [[2.0, -1.5, 0.5], 2]])
    del section["ns_steps"]                               # the segment counts give 10 steps
    cfg = OptimizerConfig.from_dict(section, "optimizer")
    opt = build_optimizer(cfg, mla)
    assert OPTIMIZERS["Muon"] is Muon and isinstance(opt, Muon)
    assert opt.ns_steps == 10 and opt.ns_eps == 1e-7 and opt.adamw_lr_mult == 0.15
    assert opt.model is mla and "output_layer.weight" in opt.adamw_param_names
    kinds = {g.get("optimizer") for g in opt.param_groups}
    assert kinds == {"muon", "adamw"}                     # routing came from param_groups
    plain = build_optimizer(dict(SEED_4_2), mla)          # a plain dict works too
    assert plain.ns_schedule == opt.ns_schedule[:5]
    with pytest.raises(ValueError, match="^Muon does not support swap.$"):
        build_optimizer(dict(SEED_4_2, swap=True), mla)
    preset = build_optimizer({"type": "Muon", "muon_coefficient_type": "quintic"}, mla)
    assert preset.ns_schedule[0] == (4.0848, -6.8946, 2.9270)


def test_upstream_learning_rate_name(mla, params):
    assert Muon(params, model=mla, learning_rate=0.01).param_groups[0]["lr"] == 0.01
    with pytest.raises(ValueError, match="give one of them"):
        Muon(params, model=mla, lr=0.03, learning_rate=0.01)


class UpstreamStyleModel:
    """The minimal model surface upstream's own Muon tests use: a config with MLA on."""

    class _Cfg:
        multi_latent_attention = True

    def get_gpt_transformer_config(self):
        return self._Cfg()


def test_minimal_upstream_style_model_works_without_qk_clip_support():
    w = Parameter(Tensor(np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)),
                  name="layers.0.weight")
    b = Parameter(Tensor(np.zeros(6, np.float32)), name="layers.0.bias")
    opt = Muon([w, b], model=UpstreamStyleModel())   # QK-Clip on: a no-op without a layout
    opt.step([Tensor(np.ones((6, 10), np.float32)), Tensor(np.ones(6, np.float32))])
    assert opt.last_qk_clip is None and opt.muon_param_names == ("layers.0.weight",)
