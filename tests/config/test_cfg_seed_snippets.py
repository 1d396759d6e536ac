"""Every YAML snippet of the MindFormers pretraining guide's config sections (training,
optimizer, lr_scheduler, ...) loads, with the documented defaults."""
import pytest

from mindformers_core.config import load_config
from mindformers_core.config.yaml_io import load_yaml_text

TRAINING = """
training:
  steps: 1000
  local_batch_size: 2
  global_batch_size: 4
  max_norm: 1.0
  seed: 42
  deterministic: False
"""
ADAMW = "optimizer: {type: AdamW}\n"
SCHED = "lr_scheduler: {type: ConstantWarmUpLR, warmup_steps: 0}\n"

OPTIMIZERS = {
    "1.1": """
optimizer:
  type: AdamW
  betas:
    - 0.9
    - 0.95
  eps: 1.e-8
  weight_decay: 0.01
""",
    "1.1-exclude": """
optimizer:
  type: AdamW
  weight_decay: 0.1
  weight_decay_exclude:
    - "*norm*"
    - "*bias*"
""",
    "1.2": """
optimizer:
  type: Muon
  weight_decay: 0.1
  momentum: 0.95
  matched_adamw_rms: 0.2
  nesterov: True
  eps: 1.e-7
  ns_steps: 5
  ns_coefficients: [3.4445, -4.7750, 2.0315]
  adamw_betas:
    - 0.95
    - 0.95
  adamw_eps: 1.e-8
  qk_clip_enabled: True
  qk_clip_threshold: 100
  comm_strategy: allgather
model: {model_type: deepseek_v3}
""",
    "1.2-segmented": """
optimizer:
  type: Muon
  ns_coefficients:
    - [[3.4445, -4.7750, 2.0315], 8]
    - [[2.0, -1.5, 0.5], 2]
model: {model_type: deepseek_v3}
""",
}

SCHEDULERS = {
    "2.1": "type: ConstantWarmUpLR\nlearning_rate: 1.e-5\nwarmup_steps: 100\nwarmup_lr_init: 0.0",
    "2.2": "type: LinearWithWarmUpLR\nlearning_rate: 1.e-5\nwarmup_ratio: 0.01\n"
           "warmup_lr_init: 0.0",
    "2.3": "type: CosineWithWarmUpLR\nlearning_rate: 1.e-5\nwarmup_ratio: 0.01\n"
           "warmup_lr_init: 0.0\nlr_end: 0.0\nnum_cycles: 0.5",
    "2.4": "type: CosineWithRestartsAndWarmUpLR\nlearning_rate: 1.e-5\nwarmup_ratio: 0.01\n"
           "lr_end: 0.0\nnum_cycles: 1.0",
    "2.5": "type: PolynomialWithWarmUpLR\nlearning_rate: 1.e-5\nwarmup_ratio: 0.01\n"
           "lr_end: 1.e-7\npower: 1.0",
    "2.6": "type: WarmUpStableDecayLR\nlearning_rate: 1.e-5\nwarmup_steps: 100\n"
           "warmup_lr_init: 0.0\nlr_end: 1.e-7\ndecay_start_ratio: 0.8",
    "2.7": "type: CosineAnnealingLR\nbase_lr: 1.e-5\nt_max: 1000\neta_min: 0.0",
}


def _indent(text):
    return "lr_scheduler:\n" + "".join(f"  {line}\n" for line in text.splitlines())


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_snippets_load(name):
    cfg = load_config(load_yaml_text(TRAINING + OPTIMIZERS[name] + SCHED))
    if cfg.optimizer.type == "Muon":
        assert cfg.optimizer.eps == 1e-7 and cfg.optimizer.weight_decay == 0.1
    if name == "1.2-segmented":
        assert cfg.optimizer.ns_steps == 10


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_scheduler_snippets_load(name):
    cfg = load_config(load_yaml_text(TRAINING + ADAMW + _indent(SCHEDULERS[name])))
    plan = cfg.plan()
    expected_warmup = {"2.1": 100, "2.6": 100, "2.7": 0}.get(name, 10)  # int(1000 * 0.01)
    assert plan.warmup_steps == expected_warmup
    if name == "2.6":
        assert plan.decay_start_steps == 800


def test_documented_scheduler_defaults():
    cfg = load_config(load_yaml_text(TRAINING + ADAMW + _indent(
        "type: CosineWithWarmUpLR\nlearning_rate: 1.e-5")))
    s = cfg.lr_scheduler
    assert (s.num_cycles, s.lr_end, s.warmup_steps in (0, None)) == (0.5, 0.0, True)
    cfg = load_config(load_yaml_text(TRAINING + ADAMW + _indent(
        "type: PolynomialWithWarmUpLR\nwarmup_steps: 0")))
    assert (cfg.lr_scheduler.power, cfg.lr_scheduler.lr_end) == (1.0, 1e-7)
    assert cfg.lr_scheduler.learning_rate == 1e-5
