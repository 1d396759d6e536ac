"""The value rules shared by the optimizer classes, the param-group overrides and the config
layer are written once (core.optimizer_rules): each layer refuses exactly the same values and
only adds its location (argument name, ParamKey, dotted path)."""
import pytest

from mindformers_core.config import ConfigError, OptimizerConfig
from mindformers_core.core.optimizer_rules import (OVERRIDE_RANGES, check_beta_count,
                                                   check_beta_range, check_embedding_min_norm,
                                                   check_weight_decay, is_beta_pair,
                                                   override_value_problem)

VALUES = [-1.0, 0.0, 1e-9, 0.5, 2.0, float("nan"), float("inf")]


def config_accepts(section):
    try:
        OptimizerConfig.from_dict(section, "optimizer")
        return True
    except ConfigError:
        return False


@pytest.mark.parametrize("field", sorted(OVERRIDE_RANGES))
@pytest.mark.parametrize("value", VALUES)
def test_override_ranges_agree_between_config_and_optim(field, value):
    rule_ok = override_value_problem(field, value) is None
    assert rule_ok == config_accepts({"param_overrides": [{"name": "*", field: value}]})
    # the closed form of each interval
    expected = value == value and abs(value) != float("inf") and (
        value > 0 if field == "eps" else value >= 0)
    assert rule_ok == expected


@pytest.mark.parametrize("betas, ok", [
    ([0.9, 0.95], True), ((0.0, 0.0), True), ([0.9], False), ([0.9, 1.0], False),
    ([-0.1, 0.9], False), ([0.9, 0.95, 0.99], False), ([True, 0.9], False), ("ab", False),
])
def test_beta_pair_one_rule(betas, ok):
    assert is_beta_pair(betas) is ok
    assert (override_value_problem("betas", betas) is None) is ok
    if isinstance(betas, list) and all(isinstance(b, float) for b in betas):
        assert config_accepts({"betas": betas}) is ok
        assert config_accepts({"param_overrides": [{"name": "*", "betas": betas}]}) is ok


def test_override_problem_wording():
    assert override_value_problem("lr_mult", -1.0) == "must be >= 0"
    assert override_value_problem("eps", 0.0) == "must be > 0"
    assert override_value_problem("wd_mult", True) == "must be a finite number"
    assert override_value_problem("betas", [0.9]) == "must be two numbers in [0, 1)"
    assert override_value_problem("optimizer", "adam") == \
        "is not one of ['adamw', 'muon', 'sgd', 'lion']"
    assert override_value_problem("optimizer", "muon", ("adamw",)) == \
        "cannot be used with this optimizer type; allowed: ['adamw']"
    assert override_value_problem("optimizer", "AdamW", ("adamw",)) is None


@pytest.mark.parametrize("value", [None, 1e-3, 1])
def test_embedding_min_norm_accepts(value):
    check_embedding_min_norm(value)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), True])
def test_embedding_min_norm_refuses(value):
    with pytest.raises(ValueError, match=r"^must be a finite positive value, got "):
        check_embedding_min_norm(value)


def test_torch_wording_of_the_adam_lion_checks():
    with pytest.raises(ValueError, match=r"^For 'Lion', the betas size should be in : \[2\], "
                                         r"but got 1\.$"):
        check_beta_range((0.9,), "Lion")
    with pytest.raises(ValueError, match=r"^Invalid beta parameter at index 1: 1\.0, should be "
                                         r">= 0 and < 1\.$"):
        check_beta_range((0.9, 1.0), "AdamW")
    check_beta_range((0.9, 0.95, 0.99), "AdamW")         # the count is a separate, later check
    with pytest.raises(ValueError, match=r"^For 'AdamW', the betas size should be in : \[2\], "
                                         r"but got 3\.$"):
        check_beta_count((0.9, 0.95, 0.99), "AdamW")
    with pytest.raises(ValueError, match=r"^Invalid weight_decay value: -0\.5, should be >= 0\.$"):
        check_weight_decay(-0.5)
    check_weight_decay(0.0)


@pytest.mark.parametrize("opt_type", ["AdamW", "Muon", "SGD", "Lion"])
@pytest.mark.parametrize("kind", ["adamw", "muon", "sgd", "lion"])
def test_group_kinds_agree_between_config_and_optim(opt_type, kind):
    from mindformers_core.core.optimizer_rules import ALLOWED_GROUP_OPTIMIZERS
    rule_ok = override_value_problem("optimizer", kind,
                                     ALLOWED_GROUP_OPTIMIZERS[opt_type.lower()]) is None
    assert rule_ok == config_accepts({"type": opt_type,
                                      "param_overrides": [{"name": "*", "optimizer": kind}]})
    assert rule_ok == (kind == opt_type.lower() or (opt_type, kind) == ("Muon", "adamw"))


def test_group_kind_wording_in_the_config():
    with pytest.raises(ConfigError, match=r"^optimizer\.param_overrides\[0\]\.optimizer: 'adamw' "
                                          r"groups need optimizer\.type AdamW or Muon, got SGD$"):
        OptimizerConfig.from_dict({"type": "SGD", "param_overrides": [
            {"name": "*", "optimizer": "adamw"}]}, "optimizer")
