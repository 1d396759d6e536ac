"""Muon's rules are written once (core.muon_rules): the optimizer's wording and the config's
ConfigError refuse exactly the same values."""
import pytest

from mindformers_core.config import ConfigError, OptimizerConfig
from mindformers_core.core.muon_rules import MUON_RANGES, check_muon_range

VALUES = [-1.0, 0.0, 1e-9, 0.5, 0.999, 1.0, 2.0]


@pytest.mark.parametrize("name", sorted(MUON_RANGES))
@pytest.mark.parametrize("value", VALUES)
def test_optimizer_and_config_refuse_the_same_values(name, value):
    try:
        check_muon_range(name, value)
        class_ok = True
    except ValueError as exc:
        class_ok = False
        assert str(exc).startswith(f"{name} must be ") and str(exc).endswith(f"got {value!r}.")
    try:
        OptimizerConfig.from_dict({"type": "Muon", name: value}, "optimizer")
        config_ok = True
    except ConfigError as exc:
        config_ok = False
        assert exc.path == f"optimizer.{name}"
    assert class_ok == config_ok


def test_wording():
    with pytest.raises(ValueError, match=r"^momentum must be in \[0, 1\), got 1\.0\.$"):
        check_muon_range("momentum", 1.0)
    with pytest.raises(ValueError, match=r"^matched_adamw_rms must be positive, got 0\.0\.$"):
        check_muon_range("matched_adamw_rms", 0.0)
    with pytest.raises(ValueError, match=r"^adamw_lr_mult must be >= 0, got -1\.0\.$"):
        check_muon_range("adamw_lr_mult", -1.0)


@pytest.mark.parametrize("swap", [True])
def test_swap_rule_is_wrapped_with_its_cause(swap):
    with pytest.raises(ConfigError, match=r"^optimizer\.swap: Muon does not support swap\.$") as info:
        OptimizerConfig.from_dict({"type": "Muon", "swap": swap}, "optimizer")
    assert isinstance(info.value.__cause__, ValueError)
    assert str(info.value.__cause__) == "Muon does not support swap."
