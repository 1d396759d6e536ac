"""build_optimizer: type dispatch, config fields, registry error."""
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mindformers_core.optim.adamw import AdamW
from mindformers_core.optim.build import OPTIMIZERS, build_optimizer
from mindformers_core.optim.lion import Lion
from mindformers_core.optim.sgd import SGD


class Tiny(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones((3, 2), np.float32)), name="linear.weight")
        self.bias = Parameter(Tensor(np.zeros(3, np.float32)), name="linear.bias")


def test_adamw_from_dict_with_groups():
    opt = build_optimizer({"type": "AdamW", "betas": [0.9, 0.99], "eps": 1e-8,
                           "weight_decay": 0}, Tiny())
    assert isinstance(opt, AdamW)
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    assert {p.name for p in opt.parameters} == {"linear.weight", "linear.bias"}


def test_sgd_and_lion_fields():
    sgd = build_optimizer({"type": "SGD", "sgd_momentum": 0.8, "weight_decay": 0.0}, Tiny())
    assert isinstance(sgd, SGD) and sgd.param_groups[0]["momentum"] == 0.8
    lion = build_optimizer({"type": "Lion", "lion_beta1": 0.9, "lion_beta2": 0.99,
                            "weight_decay": 0.0}, Tiny())
    assert isinstance(lion, Lion) and lion.param_groups[0]["betas"] == (0.9, 0.99)


def test_unknown_type_lists_valid_names():
    with pytest.raises(NotImplementedError,
                       match=r"Optimizer type Adagrad is not implemented yet. Valid types: "):
        build_optimizer({"type": "Adagrad"}, Tiny())
    assert "AdamW" in OPTIMIZERS and OPTIMIZERS["AdamW"] is AdamW


def test_from_optimizer_config_adamw_and_muon():
    from mindformers_core.config.optimizer import OptimizerConfig
    from mindformers_core.optim.muon import Muon
    from tests.optim.test_muon import tiny_model

    cfg = OptimizerConfig.from_dict({"type": "AdamW", "weight_decay": 0.1}, "optimizer")
    model = tiny_model()
    opt = build_optimizer(cfg, model)
    assert isinstance(opt, AdamW) and not opt.store_param_remainders  # not written: off
    assert {g["weight_decay"] for g in opt.param_groups} == {0.1, 0.0}
    cfg = OptimizerConfig.from_dict({"type": "Muon", "momentum": 0.9,
                                     "qk_clip_enabled": False}, "optimizer")
    muon = build_optimizer(cfg, model)
    assert isinstance(muon, Muon) and muon.model is model
