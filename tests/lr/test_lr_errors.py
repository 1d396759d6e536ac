"""Every error of the LR layer: a ConfigError naming the field (and what to use instead)."""
import warnings

import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.core.lr import build_lr_scheduler, scheduler_fields


def err(section, T=100, match=""):
    with pytest.raises(ConfigError, match=match) as info:
        build_lr_scheduler(section, T)
    return str(info.value)


def test_unknown_type_lists_every_name_and_closest():
    msg = err({"type": "CosineWithWarmupLR"}, match=r"^lr_scheduler\.type: unknown scheduler")
    for name in ("ConstantWarmUpLR", "WarmUpStableDecayLR", "InverseSqrtLR", "wsd",
                 "cosine_annealing_warm_restarts", "LearningRateWiseLayer"):
        assert name in msg
    assert "did you mean 'CosineWithWarmUpLR'?" in msg
    err({"type": "Foo"}, match=r"unknown scheduler 'Foo'; valid: \[")


def test_missing_and_non_string_type():
    err({"learning_rate": 1e-3}, match=r"^lr_scheduler\.type: required; one of \[")
    err({"type": 3}, match=r"^lr_scheduler\.type: expected a string, got int \(3\)")


def test_mindspore_builtin_names_point_to_ours():
    err({"type": "CosineDecayLR"}, match="MindSpore's CosineDecayLR cannot be built from a "
                                         r"config .*use CosineWithWarmUpLR")


def test_total_steps_in_section_is_refused():
    err({"type": "cosine", "total_steps": 100},
        match=r"^lr_scheduler\.total_steps: must not be set: total_steps comes from training\.steps")


def test_unknown_key_names_valid_keys_and_closest():
    msg = err({"type": "cosine", "warmup_step": 5},
              match=r"^lr_scheduler\.warmup_step: unknown key for CosineWithWarmUpLR; valid keys:")
    assert "did you mean 'warmup_steps'?" in msg and "'num_cycles'" in msg


def test_keys_upstream_ignores_say_what_to_use_instead():
    err({"type": "LinearWithWarmUpLR", "lr_end": 1e-6},
        match=r"^lr_scheduler\.lr_end: unknown key .*use PolynomialWithWarmUpLR with power: 1\.0")
    err({"type": "ConstantWarmUpLR", "lr_end": 1e-6},
        match=r"^lr_scheduler\.lr_end: .*use WarmUpStableDecayLR or ConstantWithCoolDownLR")
    err({"type": "CosineWithRestartsAndWarmUpLR", "decay_ratio": 0.5},
        match=r"^lr_scheduler\.decay_ratio: .*upstream ignores it\); use decay_steps")
    err({"type": "wsd", "decay_steps": 10, "decay_start_steps": 5},
        match=r"^lr_scheduler\.decay_steps: .*use decay_start_steps or decay_start_ratio")
    err({"type": "wsd", "decay_ratio": 0.1, "decay_start_steps": 5},
        match=r"^lr_scheduler\.decay_ratio: .*use decay_start_ratio or decay_start_steps")
    err({"type": "ConstantWithCoolDownLR", "lr_end": 0.0},
        match=r"^lr_scheduler\.lr_end: .*use those")
    # a key of another schedule names the schedules that accept it
    err({"type": "cosine", "t_max": 10}, match=r"t_max is a field of CosineAnnealingLR")


def test_learning_rate_on_base_lr_schedules():
    err({"type": "CosineAnnealingLR", "learning_rate": 1e-3, "t_max": 10},
        match=r"^lr_scheduler\.learning_rate: CosineAnnealingLR takes its peak from base_lr .*"
              "write base_lr instead")
    err({"type": "LearningRateWiseLayer", "learning_rate": 1e-3, "lr_scale": 2.0,
         "base_lr": {"type": "cosine"}},
        match="put learning_rate inside the base_lr section")


@pytest.mark.parametrize("key,value,match", [
    ("warmup_steps", -1, r"^lr_scheduler\.warmup_steps: must be an int >= 0, got -1$"),
    ("warmup_steps", 5.0, r"warmup_steps: must be an int >= 0, got float \(5\.0\); write 5"),
    ("warmup_steps", True, r"warmup_steps: must be an int >= 0, got bool \(True\)"),
    ("warmup_steps", "10", r"warmup_steps: must be an int >= 0, got str \('10'\)"),
    ("warmup_ratio", 1.5, r"^lr_scheduler\.warmup_ratio: must be in \[0, 1\], got 1\.5"),
    ("warmup_ratio", -0.1, r"warmup_ratio: must be in \[0, 1\], got -0\.1"),
    ("learning_rate", float("nan"), r"^lr_scheduler\.learning_rate: must be a finite number, got nan"),
    ("learning_rate", float("inf"), r"learning_rate: must be a finite number, got inf"),
    ("learning_rate", True, r"learning_rate: expected a number, got bool \(True\)"),
    ("learning_rate", "1e-3", r"learning_rate: expected a number, got str"),
    ("learning_rate", -1e-3, r"learning_rate: must be >= 0, got -0\.001"),
    ("learning_rate", None, r"learning_rate: required: the peak learning rate"),
    ("warmup_lr_init", -1e-5, r"warmup_lr_init: must be >= 0"),
    ("lr_end", 1e-2, r"^lr_scheduler\.lr_end: must be <= learning_rate \(0\.001\), got 0\.01"),
    ("lr_end", -1e-9, r"lr_end: must be >= 0"),
    ("num_cycles", -0.5, r"num_cycles: must be >= 0"),
    ("decay_steps", -3, r"decay_steps: must be an int >= 0, got -3"),
    ("decay_ratio", 2, r"decay_ratio: must be in \[0, 1\], got 2\.0"),
])
def test_field_values_on_cosine(key, value, match):
    section = {"type": "CosineWithWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 10}
    section[key] = value
    err(section, match=match)


def test_ints_accepted_for_float_fields():
    s = build_lr_scheduler({"type": "cosine", "learning_rate": 1, "lr_end": 0,
                            "warmup_ratio": 0, "num_cycles": 1}, 10)
    assert s.peak_lr == 1.0 and isinstance(s.peak_lr, float)


def test_warmup_longer_than_total():
    err({"type": "linear", "warmup_steps": 101},
        match=r"^lr_scheduler\.warmup_steps: warmup \(101 steps\) is longer than total_steps "
              r"\(100, from training\.steps\)")
    build_lr_scheduler({"type": "linear", "warmup_steps": 100}, 100)  # equal is fine


def test_total_steps_must_be_positive_int():
    for bad in (0, -5, 10.0, True, None):
        with pytest.raises(ConfigError, match=r"^training\.steps: total_steps of the LR schedule "
                                              r"comes from training\.steps and must be an int >= 1"):
            build_lr_scheduler({"type": "cosine"}, bad)


def test_polynomial_and_wsd_specific():
    err({"type": "polynomial", "learning_rate": 1e-3, "lr_end": 2e-3},
        match=r"^lr_scheduler\.lr_end: must be <= learning_rate")
    err({"type": "polynomial", "power": -1.0}, match=r"^lr_scheduler\.power: must be >= 0")
    err({"type": "wsd", "learning_rate": 1e-3},
        match=r"^lr_scheduler\.decay_start_steps: WarmUpStableDecayLR needs decay_start_steps "
              "or decay_start_ratio")
    err({"type": "wsd", "decay_start_steps": 5, "decay_style": "exp"},
        match=r"^lr_scheduler\.decay_style: must be one of \['linear', 'cosine', '1-sqrt'\], "
              "got 'exp'")
    err({"type": "wsd", "decay_start_ratio": 1.2},
        match=r"decay_start_ratio: must be in \[0, 1\]")


def test_restarts_num_cycles_positive():
    err({"type": "cosine_with_restarts", "num_cycles": 0},
        match=r"^lr_scheduler\.num_cycles: must be > 0, got 0\.0")


def test_cooldown_floors():
    base = {"type": "ConstantWithCoolDownLR", "learning_rate": 1e-3}
    err({**base, "lr_end1": 2e-3}, match=r"^lr_scheduler\.lr_end1: must be <= learning_rate")
    err({**base, "lr_end1": 1e-5, "lr_end2": 1e-4},
        match=r"^lr_scheduler\.lr_end2: must be <= lr_end1 \(1e-05\), got 0\.0001 \(the lr must "
              "not rise after the cool-down\)")
    err({**base, "keep_steps": -1}, match=r"keep_steps: must be an int >= 0, got -1")
    err({**base, "final_steps": 1.5}, match=r"final_steps: must be an int >= 0, got float")


def test_annealing_fields():
    err({"type": "CosineAnnealingLR", "t_max": 10},
        match=r"^lr_scheduler\.base_lr: required: the peak lr of this schedule")
    err({"type": "CosineAnnealingLR", "base_lr": 1e-3},
        match=r"^lr_scheduler\.t_max: required: half period")
    err({"type": "CosineAnnealingLR", "base_lr": 1e-3, "t_max": 0},
        match=r"^lr_scheduler\.t_max: must be an int >= 1, got 0")
    err({"type": "CosineAnnealingLR", "base_lr": 1e-3, "t_max": 10, "eta_min": 1e-2},
        match=r"^lr_scheduler\.eta_min: must be <= base_lr \(0\.001\), got 0\.01")
    err({"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3},
        match=r"^lr_scheduler\.t_0: required")
    err({"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3, "t_0": 0},
        match=r"t_0: must be an int >= 1, got 0")
    err({"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3, "t_0": 5, "t_mult": 0},
        match=r"^lr_scheduler\.t_mult: must be an int >= 1, got 0")
    err({"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3, "t_0": 5, "t_mult": 1.5},
        match=r"t_mult: must be an int >= 1, got float \(1\.5\)")


def test_learning_rate_wise_layer_errors_name_nested_path():
    err({"type": "LearningRateWiseLayer", "base_lr": {"type": "cosine"}},
        match=r"^lr_scheduler\.lr_scale: required")
    err({"type": "LearningRateWiseLayer", "lr_scale": 0.0, "base_lr": {"type": "cosine"}},
        match=r"^lr_scheduler\.lr_scale: must be > 0, got 0\.0")
    err({"type": "LearningRateWiseLayer", "lr_scale": 2.0},
        match=r"^lr_scheduler\.base_lr: required: the wrapped schedule section")
    err({"type": "LearningRateWiseLayer", "lr_scale": 2.0,
         "base_lr": {"type": "cosine", "warmup_steps": -2}},
        match=r"^lr_scheduler\.base_lr\.warmup_steps: must be an int >= 0, got -2")
    err({"type": "LearningRateWiseLayer", "lr_scale": 2.0, "base_lr": {"type": "nope"}},
        match=r"^lr_scheduler\.base_lr\.type: unknown scheduler 'nope'")
    err({"type": "LearningRateWiseLayer", "lr_scale": 2.0, "base_lr": 1e-3},
        match=r"^lr_scheduler\.base_lr: expected a mapping, got float")


def test_both_ratio_and_steps_warn_and_ratio_wins():
    with pytest.warns(UserWarning, match=r"lr_scheduler: both warmup_ratio \(0\.1\) and "
                                         r"warmup_steps \(50\) are set; warmup_ratio wins: "
                                         r"warmup = int\(100 \* 0\.1\) = 10 steps"):
        s = build_lr_scheduler({"type": "cosine", "warmup_steps": 50, "warmup_ratio": 0.1}, 100)
    assert s.boundaries()["warmup_end"] == 10
    assert "warmup_steps" not in s.to_dict() and s.to_dict()["warmup_ratio"] == 0.1
    with pytest.warns(UserWarning, match="decay_start_ratio wins"):
        build_lr_scheduler({"type": "wsd", "decay_start_steps": 50, "decay_start_ratio": 0.9}, 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # a single setting never warns
        build_lr_scheduler({"type": "cosine", "warmup_ratio": 0.1, "warmup_steps": None}, 100)


def test_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match=r"^lr_scheduler: expected a mapping, got list"):
        build_lr_scheduler([1, 2], 10)


def test_scheduler_fields():
    f = scheduler_fields("cosine")
    assert f == {"learning_rate": 1e-5, "warmup_steps": None, "warmup_ratio": None,
                 "warmup_lr_init": 0.0, "num_cycles": 0.5, "lr_end": 0.0, "decay_steps": None,
                 "decay_ratio": None}
    assert scheduler_fields("PolynomialWithWarmUpLR")["lr_end"] == 1e-7
    assert scheduler_fields("WarmUpStableDecayLR")["decay_style"] == "linear"
    assert "learning_rate" not in scheduler_fields("CosineAnnealingLR")
    assert scheduler_fields("cosine_annealing_warm_restarts") == {
        "base_lr": None, "t_0": None, "t_mult": 1, "eta_min": 0.0}
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.type: unknown scheduler 'nope'"):
        scheduler_fields("nope")
    scheduler_fields("cosine")["lr_end"] = 5.0       # a copy: the class defaults are unchanged
    assert scheduler_fields("cosine")["lr_end"] == 0.0
