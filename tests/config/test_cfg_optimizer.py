"""optimizer: section: type-specific keys, type defaults, every range rule with its message."""
import math

import pytest

from mindformers_core.config import ConfigError, OPTIMIZER_KEYS, OptimizerConfig


def load(**kw):
    return OptimizerConfig.from_dict(kw, "optimizer")


def test_adamw_defaults_seed_table():
    o = load()
    assert o.type == "AdamW"
    assert o.betas == [0.9, 0.95] and o.eps == 1e-8 and o.weight_decay == 0.01
    assert o.weight_decay_include is None and o.weight_decay_exclude is None
    assert o.decoupled_weight_decay is True and o.grad_norm_skip_threshold == math.inf


def test_muon_defaults_seed_table():
    o = load(type="Muon")
    assert (o.weight_decay, o.momentum, o.matched_adamw_rms, o.nesterov, o.eps, o.ns_steps) == \
        (0.1, 0.95, 0.2, True, 1e-7, 5)
    assert o.ns_coefficients == [3.4445, -4.7750, 2.0315]
    assert o.adamw_betas == [0.95, 0.95] and o.adamw_eps == 1e-8
    assert (o.qk_clip_enabled, o.qk_clip_threshold, o.comm_strategy) == (True, 100.0, "allgather")
    assert o.use_fused_adamw is False and o.adamw_include is None
    assert o.muon_split_qkv is True and o.adamw_lr_mult == 1.0
    assert o.ns_schedule() == [(3.4445, -4.7750, 2.0315)] * 5


def test_muon_written_eps_and_wd_win():
    o = load(type="Muon", eps=1e-8, weight_decay=0.01)
    assert o.eps == 1e-8 and o.weight_decay == 0.01


def test_sgd_lion_defaults():
    s = load(type="SGD")
    assert s.sgd_momentum == 0.9 and s.weight_decay == 0.01
    lion = load(type="Lion")
    assert (lion.lion_beta1, lion.lion_beta2) == (0.95, 0.98)


def test_adamw_kernel_fields_and_swap_accepted():
    o = load(use_fused=True, enable_fused_opt=True, swap=True, decoupled_weight_decay=False,
             exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16", store_param_remainders=False)
    assert o.use_fused and o.enable_fused_opt and o.swap and not o.decoupled_weight_decay


def test_megatron_knobs_accepted():
    o = load(decoupled_lr=1e-3, decoupled_min_lr=1e-5, rmsnorm_weight_decay_mult=0.5,
             apply_wd_to_qk_layernorm=True, embedding_min_norm=0.1, grad_norm_skip_threshold=10,
             loss_scale=1024, initial_loss_scale=65536, min_loss_scale=1, loss_scale_window=100,
             hysteresis=3, log_num_zeros_in_grad=True)
    assert o.decoupled_lr == 1e-3 and o.grad_norm_skip_threshold == 10.0


def test_grad_norm_skip_threshold_allows_inf():
    assert load(grad_norm_skip_threshold=float("inf")).grad_norm_skip_threshold == math.inf


def test_segmented_ns_coefficients_set_steps():
    o = load(type="Muon", ns_coefficients=[[[3.4445, -4.775, 2.0315], 8], [[2.0, -1.5, 0.5], 2]])
    assert o.ns_steps == 10 and len(o.ns_schedule()) == 10


def test_coefficient_preset():
    o = load(type="Muon", muon_coefficient_type="quintic")
    assert o.ns_schedule()[0] == (4.0848, -6.8946, 2.9270)
    assert "ns_coefficients" not in o.to_dict()


def test_adamw_include_bare_string_is_one_pattern():
    assert load(type="Muon", adamw_include="*embed*").adamw_include == ["*embed*"]


@pytest.mark.parametrize("kw, match", [
    # type
    ({"type": "adamw"}, r"^optimizer\.type: must be one of \['AdamW', 'Muon', 'SGD', 'Lion'\], "
                        r"got 'adamw'; did you mean 'AdamW'\?"),
    ({"type": "Adafactor"}, r"^optimizer\.type: must be one of"),
    ({"type": None}, r"^optimizer\.type: must be one of .* got None"),
    # unknown / wrong-type keys
    ({"lr_foo": 1}, r"^optimizer\.lr_foo: unknown key for type AdamW; valid keys: \[.*'betas'"),
    ({"betaz": [0.9, 0.9]}, r"^optimizer\.betaz: unknown key .*did you mean 'betas'\?"),
    ({"type": "Muon", "betas": [0.9, 0.95]},
     r"^optimizer\.betas: not accepted by type Muon: Muon uses 'adamw_betas'"),
    ({"type": "SGD", "momentum": 0.9}, r"^optimizer\.momentum: .*'sgd_momentum'"),
    ({"type": "Lion", "betas": [0.9, 0.9]}, r"^optimizer\.betas: .*'lion_beta1' and 'lion_beta2'"),
    ({"momentum": 0.9}, r"^optimizer\.momentum: unknown key for type AdamW; .*belongs to "
                        r"\['Muon'\]"),
    ({"type": "SGD", "eps": 1e-8}, r"^optimizer\.eps: unknown key for type SGD"),
    ({"type": "Muon", "swap": True}, r"^optimizer\.swap: Muon does not support swap\.$"),
    # AdamW ranges
    ({"betas": [0.9]}, r"^optimizer\.betas: expected 2 values in \[0, 1\), got \[0\.9\]"),
    ({"betas": [0.9, 1.0]}, r"^optimizer\.betas: expected 2 values in \[0, 1\)"),
    ({"betas": [-0.1, 0.9]}, r"^optimizer\.betas: expected 2 values in \[0, 1\)"),
    ({"betas": [0.9, "a"]}, r"^optimizer\.betas\[1\]: expected a number"),
    ({"betas": 0.9}, r"^optimizer\.betas: expected a list"),
    ({"eps": 0}, r"^optimizer\.eps: must be > 0, got 0\.0"),
    ({"eps": "1e-8"}, r"^optimizer\.eps: expected a number, got str"),
    ({"eps": None}, r"^optimizer\.eps: must not be null"),
    ({"weight_decay": -0.01}, r"^optimizer\.weight_decay: must be >= 0, got -0\.01"),
    ({"weight_decay": float("nan")}, r"^optimizer\.weight_decay: must be a finite number, got nan"),
    ({"weight_decay": float("inf")}, r"^optimizer\.weight_decay: must be a finite number"),
    ({"weight_decay_exclude": [1]}, r"^optimizer\.weight_decay_exclude\[0\]: expected a string"),
    ({"weight_decay_exclude": [""]}, r"^optimizer\.weight_decay_exclude\[0\]: empty pattern"),
    ({"exp_avg_dtype": "fp16"}, r"^optimizer\.exp_avg_dtype: must be one of \['fp32', 'bf16'\]"),
    ({"use_fused": "yes"}, r"^optimizer\.use_fused: expected a bool"),
    # Megatron validate()
    ({"embedding_min_norm": 0.0}, r"^optimizer\.embedding_min_norm: must be a finite positive "
                                  r"value, got 0\.0"),
    ({"embedding_min_norm": float("inf")}, r"^optimizer\.embedding_min_norm: must be a finite"),
    ({"rmsnorm_weight_decay_mult": -1.0},
     r"^optimizer\.rmsnorm_weight_decay_mult: must be a finite nonnegative value, got -1\.0"),
    ({"rmsnorm_weight_decay_mult": float("inf")},
     r"^optimizer\.rmsnorm_weight_decay_mult: must be a finite number"),
    ({"decoupled_lr": -1e-3}, r"^optimizer\.decoupled_lr: must be >= 0"),
    ({"decoupled_lr": 1e-4, "decoupled_min_lr": 1e-3},
     r"^optimizer\.decoupled_min_lr: must be <= decoupled_lr \(0\.0001\), got 0\.001"),
    ({"decoupled_min_lr": 1e-5}, r"^optimizer\.decoupled_min_lr: has no effect without "
                                 r"decoupled_lr"),
    ({"grad_norm_skip_threshold": 0}, r"^optimizer\.grad_norm_skip_threshold: must be > 0"),
    ({"grad_norm_skip_threshold": float("nan")},
     r"^optimizer\.grad_norm_skip_threshold: must be a finite number, got nan"),
    ({"loss_scale": 0}, r"^optimizer\.loss_scale: must be > 0"),
    ({"initial_loss_scale": -1}, r"^optimizer\.initial_loss_scale: must be > 0"),
    ({"min_loss_scale": 0}, r"^optimizer\.min_loss_scale: must be > 0"),
    ({"min_loss_scale": 1024, "initial_loss_scale": 512},
     r"^optimizer\.min_loss_scale: must be <= initial_loss_scale \(512\.0\), got 1024\.0"),
    ({"loss_scale_window": 0}, r"^optimizer\.loss_scale_window: must be > 0"),
    ({"hysteresis": 0}, r"^optimizer\.hysteresis: must be >= 1, got 0"),
    # Muon ranges and upstream messages
    ({"type": "Muon", "momentum": 1.0}, r"^optimizer\.momentum: must be in \[0, 1\), got 1\.0"),
    ({"type": "Muon", "matched_adamw_rms": 0}, r"^optimizer\.matched_adamw_rms: must be > 0"),
    ({"type": "Muon", "eps": -1e-7}, r"^optimizer\.eps: must be > 0"),
    ({"type": "Muon", "adamw_eps": 0}, r"^optimizer\.adamw_eps: must be > 0"),
    ({"type": "Muon", "adamw_betas": [0.95]}, r"^optimizer\.adamw_betas: expected 2 values in "
                                              r"\[0, 1\)"),
    ({"type": "Muon", "ns_steps": 0}, r"^optimizer\.ns_steps: ns_steps must be positive, got 0\."),
    ({"type": "Muon", "ns_steps": 5000}, r"^optimizer\.ns_steps: must be <= 1000, got 5000"),
    ({"type": "Muon", "ns_coefficients": [[[1.0, 2.0, 3.0], 10 ** 12]]},
     r"^optimizer\.ns_coefficients: Newton-Schulz schedule of 1000000000000 steps is longer"),
    ({"eps": 10 ** 400}, r"^optimizer\.eps: must be a finite number, got 1000"),
    ({"type": "Muon", "ns_coefficients": [1.0, 2.0]},
     r"^optimizer\.ns_coefficients: flat ns_coefficients must have 3 elements, got \[1\.0, 2\.0\]\."),
    ({"type": "Muon", "ns_coefficients": []},
     r"^optimizer\.ns_coefficients: ns_coefficients must be a non-empty list/tuple, got \[\]\."),
    ({"type": "Muon", "ns_coefficients": [[[1.0, 2.0, 3.0], 0]]},
     r"^optimizer\.ns_coefficients: segmented ns_coefficients entry 0 count must be positive"),
    ({"type": "Muon", "ns_coefficients": [[1.0, 2.0, 3.0]]},
     r"^optimizer\.ns_coefficients: segmented ns_coefficients entry 0 must be \[\[a, b, c\], count\]"),
    ({"type": "Muon", "ns_coefficients": [[[1.0, 2.0], 2]]},
     r"^optimizer\.ns_coefficients: segmented ns_coefficients entry 0 must hold a 3-element triple"),
    ({"type": "Muon", "qk_clip_threshold": 0},
     r"^optimizer\.qk_clip_threshold: qk_clip_threshold must be positive, got 0\.0\."),
    ({"type": "Muon", "qk_clip_threshold": -5.0},
     r"^optimizer\.qk_clip_threshold: qk_clip_threshold must be positive"),
    ({"type": "Muon", "comm_strategy": "p2p"},
     r"^optimizer\.comm_strategy: must be one of \['allgather', 'allgather_deredundency'\], "
     r"got 'p2p'"),
    ({"type": "Muon", "adamw_include": [3]}, r"^optimizer\.adamw_include"),
    ({"type": "Muon", "muon_scalar_optimizer": "sgd"},
     r"^optimizer\.muon_scalar_optimizer: must be one of \['adam', 'lion'\]"),
    ({"type": "Muon", "muon_scale_mode": "rms"}, r"^optimizer\.muon_scale_mode: must be one of"),
    ({"type": "Muon", "muon_coefficient_type": "quintik"},
     r"^optimizer\.muon_coefficient_type: must be one of .*did you mean 'quintic'\?"),
    ({"type": "Muon", "muon_coefficient_type": "quintic", "ns_coefficients": [1.0, 2.0, 3.0]},
     r"^optimizer\.muon_coefficient_type: set either muon_coefficient_type .* not both"),
    ({"type": "Muon", "ns_dtype": "float16"}, r"^optimizer\.ns_dtype: must be one of"),
    ({"type": "Muon", "muon_extra_scale_factor": 0}, r"^optimizer\.muon_extra_scale_factor: must "
                                                     r"be > 0"),
    ({"type": "Muon", "adamw_lr_mult": -1}, r"^optimizer\.adamw_lr_mult: must be >= 0"),
    ({"type": "Muon", "ns_batch_memory_gb": 0},
     r"^optimizer\.ns_batch_memory_gb: ns_batch_memory_gb must be positive, but got 0\.0\."),
    ({"type": "Muon", "phase0_batch_memory_gb": True},
     r"^optimizer\.phase0_batch_memory_gb: expected a number, got bool"),
    # SGD / Lion
    ({"type": "SGD", "sgd_momentum": 1.0}, r"^optimizer\.sgd_momentum: must be in \[0, 1\)"),
    ({"type": "Lion", "lion_beta1": -0.1}, r"^optimizer\.lion_beta1: must be in \[0, 1\)"),
    ({"type": "Lion", "lion_beta2": 1.5}, r"^optimizer\.lion_beta2: must be in \[0, 1\)"),
    # not a mapping
])
def test_invalid(kw, match):
    with pytest.raises(ConfigError, match=match):
        load(**kw)


def test_qk_clip_threshold_only_checked_when_enabled():
    assert load(type="Muon", qk_clip_enabled=False, qk_clip_threshold=0).qk_clip_threshold == 0.0


def test_not_a_mapping():
    with pytest.raises(ConfigError, match=r"^optimizer: expected a mapping, got list"):
        OptimizerConfig.from_dict([1, 2], "optimizer")


@pytest.mark.parametrize("kw, match", [
    ({"param_overrides": [{"name": ["*bias"], "lr_mult": -1}]},
     r"^optimizer\.param_overrides\[0\]\.lr_mult: must be >= 0"),
    ({"param_overrides": [{"lr_mult": 2.0}]},
     r"^optimizer\.param_overrides\[0\]: selects no parameter"),
    ({"param_overrides": [{"name": ["*bias"]}]}, r"^optimizer\.param_overrides\[0\]: changes "
                                                  r"nothing"),
    ({"param_overrides": [{"name": ["*"], "lr_mult": 2.0, "max_lr": 1e-3}]},
     r"^optimizer\.param_overrides\[0\]\.lr_mult: set either lr_mult or max_lr/min_lr"),
    ({"param_overrides": [{"name": ["*"], "weight_decay": 0.1, "wd_mult": 0.5}]},
     r"^optimizer\.param_overrides\[0\]\.wd_mult: set either weight_decay or wd_mult"),
    ({"param_overrides": [{"name": ["*"], "max_lr": 1e-4, "min_lr": 1e-3}]},
     r"^optimizer\.param_overrides\[0\]\.min_lr: must be <= max_lr \(0\.0001\), got 0\.001"),
    ({"param_overrides": [{"name": ["*"], "betas": [0.9, 1.2]}]},
     r"^optimizer\.param_overrides\[0\]\.betas: expected 2 values in \[0, 1\)"),
    ({"param_overrides": [{"name": ["*"], "eps": 0}]},
     r"^optimizer\.param_overrides\[0\]\.eps: must be > 0"),
    ({"param_overrides": [{"name": ["*"], "ndim": -1, "lr_mult": 1.0}]},
     r"^optimizer\.param_overrides\[0\]\.ndim: must be >= 0"),
    ({"param_overrides": [{"name": ["*"], "optimizer": "adam"}]},
     r"^optimizer\.param_overrides\[0\]\.optimizer: must be one of"),
    ({"param_overrides": [{"name": ["*"], "optimizer": "muon"}]},
     r"^optimizer\.param_overrides\[0\]\.optimizer: 'muon' groups need optimizer\.type Muon"),
    ({"param_overrides": [{"name": ["*"], "lr_mul": 2.0}]},
     r"^optimizer\.param_overrides\[0\]\.lr_mul: unknown key.*did you mean 'lr_mult'\?"),
    ({"param_overrides": {"name": ["*"]}}, r"^optimizer\.param_overrides: expected a list"),
    ({"mup": {}}, r"^optimizer\.mup\.base_hidden_size: required"),
    ({"mup": {"base_hidden_size": 0}}, r"^optimizer\.mup\.base_hidden_size: must be >= 1"),
    ({"mup": {"width": 256}}, r"^optimizer\.mup\.width: unknown key"),
])
def test_param_overrides_and_mup_invalid(kw, match):
    with pytest.raises(ConfigError, match=match):
        load(**kw)


def test_param_overrides_valid():
    o = load(param_overrides=[{"name": "*embedding*", "lr_mult": 0.5, "weight_decay": 0.0},
                              {"ndim": 1, "wd_mult": 0.0},
                              {"name": ["*output_layer*"], "max_lr": 1e-3, "min_lr": 1e-5}],
             mup={"base_hidden_size": 256})
    assert o.param_overrides[0].name == ["*embedding*"]
    assert o.param_overrides[1].ndim == 1 and o.param_overrides[2].max_lr == 1e-3
    assert o.mup.base_hidden_size == 256


@pytest.mark.parametrize("opt_type", sorted(OPTIMIZER_KEYS))
def test_to_dict_round_trip_and_only_type_keys(opt_type):
    o = load(type=opt_type)
    d = o.to_dict()
    assert set(d) == set(OPTIMIZER_KEYS[opt_type])
    assert OptimizerConfig.from_dict(d, "optimizer") == o


def test_round_trip_segmented_and_preset():
    for kw in ({"type": "Muon", "ns_coefficients": [[[1.0, 2.0, 3.0], 3], [[2.0, -1.5, 0.5], 2]]},
               {"type": "Muon", "muon_coefficient_type": "polar_express", "ns_steps": 8}):
        o = load(**kw)
        assert OptimizerConfig.from_dict(o.to_dict(), "optimizer") == o


def test_each_type_key_is_a_field():
    fields = set(OptimizerConfig.field_names())
    for keys in OPTIMIZER_KEYS.values():
        assert keys <= fields


def test_a_segmented_schedule_replaces_a_written_ns_steps_as_upstream():
    """Upstream's master DeepSeek-V4 config writes ns_steps 8 beside a 10-step segmented
    schedule; the schedule runs (its counts), and the launch doctor warns naming both."""
    from mindformers_core.tools.doctor import check_ns_steps
    sched = [[[3.4445, -4.7750, 2.0315], 8], [[2.0, -1.5, 0.5], 2]]
    o = OptimizerConfig.from_dict({"type": "Muon", "ns_steps": 8, "ns_coefficients": sched},
                                  "optimizer")
    assert o.ns_steps == 10 and len(o.ns_schedule()) == 10 and o.replaced_ns_steps() == 8
    cfg = type("C", (), {"optimizer": o})()
    v = check_ns_steps(cfg)
    assert v.status == "WARN" and v.reason.startswith(
        "optimizer.ns_steps is 8, but the segmented ns_coefficients runs 10 Newton-Schulz "
        "iterations"), v.reason
    same = OptimizerConfig.from_dict({"type": "Muon", "ns_coefficients": sched}, "optimizer")
    assert same.replaced_ns_steps() is None and same.ns_steps == 10
    assert check_ns_steps(type("C", (), {"optimizer": same})()).status == "PASS"
