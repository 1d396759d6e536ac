"""Per-group learning rates (lr_mult / max_lr+min_lr), with_peak, LrSchedulerConfig input,
YAML-built LearningRateWiseLayer, and restart safety with an explicit resume."""
import pytest

from mindformers_core.errors import ConfigError
from mindformers_core.config.yaml_io import load_yaml_text
from mindformers_core.core.lr import build_lr_scheduler, group_lrs

SECTIONS = [
    {"type": "CosineWithWarmUpLR", "learning_rate": 2e-2, "warmup_steps": 10, "lr_end": 2e-3},
    {"type": "WarmUpStableDecayLR", "learning_rate": 1e-3, "warmup_steps": 0,
     "decay_start_ratio": 0.7, "decay_style": "1-sqrt"},
    {"type": "ConstantWithCoolDownLR", "learning_rate": 1e-3, "warmup_steps": 5,
     "keep_steps": 10, "decay_steps": 30, "final_steps": 5, "lr_end1": 1e-5, "lr_end2": 1e-6},
    {"type": "CosineAnnealingWarmRestarts", "base_lr": 1e-3, "t_0": 7, "t_mult": 2},
    {"type": "PolynomialWithWarmUpLR", "learning_rate": 1e-3, "warmup_ratio": 0.1, "power": 2.0},
]


@pytest.mark.parametrize("section", SECTIONS, ids=[s["type"] for s in SECTIONS])
def test_twenty_x_ratio_between_groups_holds_at_every_step(section):
    sched = build_lr_scheduler(section, 100)
    groups = [{"params": [], "lr_mult": 1.0}, {"params": [], "lr_mult": 20.0}, {"params": []}]
    for step in range(0, 201):
        base = sched.lr_at(step)
        a, b, c = group_lrs(sched, groups, step)
        assert a == base and c == base                       # lr_mult defaults to 1
        assert b == pytest.approx(20.0 * a, rel=1e-15, abs=0)


def test_max_lr_min_lr_groups_reshape_peak_and_floor():
    sched = build_lr_scheduler(SECTIONS[0], 100)          # 2e-2 -> 2e-3
    groups = [{"params": []}, {"params": [], "max_lr": 1e-3, "min_lr": 1e-4},
              {"params": [], "max_lr": 4e-2}, {"params": [], "min_lr": 0.0}]
    for step in (0, 5, 10, 55, 100, 150):
        g0, g1, g2, g3 = group_lrs(sched, groups, step)
        assert g0 == sched.lr_at(step)
        other = build_lr_scheduler({**SECTIONS[0], "learning_rate": 1e-3, "lr_end": 1e-4}, 100)
        assert g1 == other.lr_at(step)
        assert g2 == build_lr_scheduler({**SECTIONS[0], "learning_rate": 4e-2}, 100).lr_at(step)
        assert g3 == build_lr_scheduler({**SECTIONS[0], "lr_end": 0.0}, 100).lr_at(step)
    assert sched.with_peak(1e-3, 1e-4) is sched.with_peak(1e-3, 1e-4)   # cached
    assert sched.with_peak(1e-3, 1e-4).peak_lr == 1e-3


def test_with_peak_keeps_shape_and_checks_floor():
    sched = build_lr_scheduler(SECTIONS[2], 100)
    half = sched.with_peak(5e-4)
    assert half.boundaries() == sched.boundaries()
    assert half.lr_at(12) == 5e-4 and half.lr_at(60) == 1e-6
    low = sched.with_peak(5e-4, min_lr=1e-7)
    assert low.lr_at(47) == 1e-7 and low.lr_at(60) == 1e-7   # lr_end2 capped at the new floor
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.lr_end: must be <= learning_rate"):
        build_lr_scheduler(SECTIONS[0], 100).with_peak(1e-3)  # floor 2e-3 above new peak
    ann = build_lr_scheduler(SECTIONS[3], 100).with_peak(2e-3, 1e-5)
    assert ann.lr_at(0) == 2e-3 and ann.to_dict()["eta_min"] == 1e-5


def test_learning_rate_wise_layer_from_yaml_and_with_peak():
    text = """
lr_scheduler:
  type: LearningRateWiseLayer
  lr_scale: 0.5
  base_lr:
    type: CosineWithWarmUpLR
    learning_rate: 1e-3
    warmup_steps: 10
    lr_end: 1e-5
"""
    sec = load_yaml_text(text)["lr_scheduler"]
    sched = build_lr_scheduler(sec, 100)
    inner = build_lr_scheduler(sec["base_lr"], 100)
    assert sched.lr_at(30) == 0.5 * inner.lr_at(30)
    assert sched.peak_lr == 5e-4
    wp = sched.with_peak(2e-4, 2e-6)
    assert wp.peak_lr == pytest.approx(2e-4) and wp.lr_at(100) == pytest.approx(2e-6)
    rebuilt = build_lr_scheduler(sched.to_dict(), 100)
    assert [rebuilt.lr_at(s) for s in range(120)] == [sched.lr_at(s) for s in range(120)]


def test_accepts_lr_scheduler_config_object():
    from mindformers_core.config import LrSchedulerConfig
    cfg = LrSchedulerConfig.from_dict({"type": "cosine", "learning_rate": 1e-3,
                                       "warmup_ratio": 0.1}, "lr_scheduler")
    sched = build_lr_scheduler(cfg, 200)
    assert sched.boundaries()["warmup_end"] == 20 and sched.peak_lr == 1e-3
    ann = LrSchedulerConfig.from_dict({"type": "CosineAnnealingLR", "base_lr": 1e-3,
                                       "t_max": 10}, "lr_scheduler")
    assert build_lr_scheduler(ann, 50).lr_at(10) == 0.0


class _ToDictOnly:
    def to_dict(self):
        return {"type": "linear", "learning_rate": 1e-3, "warmup_steps": 2}


def test_accepts_any_object_with_to_dict():
    assert build_lr_scheduler(_ToDictOnly(), 10).lr_at(1) == 5e-4


def test_resume_mid_run_reproduces_the_uninterrupted_curve():
    section = {"type": "WarmUpStableDecayLR", "learning_rate": 3e-4, "warmup_ratio": 0.02,
               "decay_start_ratio": 0.9, "lr_end": 3e-5, "decay_style": "cosine"}
    T = 1000
    first = build_lr_scheduler(section, T)
    full = [first.lr_at(s) for s in range(T + 50)]
    # a run preempted at step 637 rebuilds everything from the config and the step counter
    resumed = build_lr_scheduler(dict(section), T)
    assert [resumed.lr_at(s) for s in range(637, T + 50)] == full[637:]
    # rebuilding with a different total_steps is a different curve (no silent reuse)
    assert build_lr_scheduler(section, 2 * T).lr_at(950) != full[950]
