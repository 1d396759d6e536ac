"""training: section rules, each with its message."""
import pytest

from mindformers_core.config import ConfigError, TrainingConfig


def load(**kw):
    return TrainingConfig.from_dict(kw, "training")


def test_defaults_match_seed_table():
    t = load()
    assert (t.steps, t.local_batch_size, t.global_batch_size, t.max_norm, t.seed,
            t.deterministic) == (1000, 1, 1, 1.0, 42, False)
    assert (t.use_skip_step_on_nan, t.max_consecutive_skipped_steps, t.rampup_batch_size,
            t.stop_at_step) == (False, 0, None, None)
    assert load(steps=10, stop_at_step=4).stop_at_step == 4


@pytest.mark.parametrize("kw, match", [
    ({"steps": 0}, r"^training\.steps: must be > 0, got 0"),
    ({"steps": -5}, r"^training\.steps: must be > 0, got -5"),
    ({"steps": 10.0}, r"^training\.steps: expected an int, got float \(10\.0\); write 10"),
    ({"steps": True}, r"^training\.steps: expected an int, got bool"),
    ({"local_batch_size": 0}, r"^training\.local_batch_size: must be > 0"),
    ({"global_batch_size": -1}, r"^training\.global_batch_size: must be > 0"),
    ({"global_batch_size": 0, "local_batch_size": 0}, r"^training\.global_batch_size"),
    ({"max_norm": 0}, r"^training\.max_norm: must be > 0, got 0\.0 .*write null to disable"),
    ({"max_norm": -1.0}, r"^training\.max_norm: must be > 0"),
    ({"max_norm": float("nan")}, r"^training\.max_norm: must be a finite number, got nan"),
    ({"max_norm": float("inf")}, r"^training\.max_norm: must be a finite number, got inf"),
    ({"max_norm": "1.0"}, r"^training\.max_norm: expected a number, got str"),
    ({"max_consecutive_skipped_steps": -1},
     r"^training\.max_consecutive_skipped_steps: must be >= 0, got -1\."),
    ({"max_consecutive_skipped_steps": 3},
     r"^training\.max_consecutive_skipped_steps: has no effect unless use_skip_step_on_nan"),
    ({"stop_at_step": 0}, r"^training\.stop_at_step: must be in \[1, steps=1000\], got 0"),
    ({"steps": 10, "stop_at_step": 11}, r"^training\.stop_at_step: must be in \[1, steps=10\]"),
    ({"deterministic": 1}, r"^training\.deterministic: expected a bool"),
    ({"seed": -1}, r"^training\.seed: must be in \[0, 4294967295\], got -1"),
    ({"seed": 2 ** 32}, r"^training\.seed: must be in \[0, 4294967295\]"),
    ({"seed": "42"}, r"^training\.seed: expected an int, got str"),
    ({"stepz": 3}, r"^training\.stepz: unknown key; valid keys: .*did you mean 'steps'\?"),
    ({"data_parallel": 2}, r"^training\.data_parallel: unknown key"),
])
def test_invalid(kw, match):
    with pytest.raises(ConfigError, match=match):
        load(**kw)


def test_max_norm_null_disables_clipping():
    assert load(max_norm=None).max_norm is None


def test_int_accepted_for_float():
    t = load(max_norm=2)
    assert t.max_norm == 2.0 and isinstance(t.max_norm, float)


def test_skip_guard_valid():
    t = load(use_skip_step_on_nan=True, max_consecutive_skipped_steps=5)
    assert t.max_consecutive_skipped_steps == 5


@pytest.mark.parametrize("rbs, match", [
    ([1, 2], r"^training\.rampup_batch_size: must be a 3-element list \[start_global_batch_size, "
             r"batch_size_increment, rampup_samples\], got \[1, 2\]\."),
    ([1, 2.5, 3], r"^training\.rampup_batch_size\[1\]: expected an int"),
    ([0, 2, 10], r"^training\.rampup_batch_size\[0\]: \(start_global_batch_size\) must be > 0, "
                 r"got 0\."),
    ([2, 0, 10], r"^training\.rampup_batch_size\[1\]: \(batch_size_increment\) must be > 0"),
    ([2, 2, -1], r"^training\.rampup_batch_size\[2\]: \(rampup_samples\) must be >= 0, got -1\."),
    ([16, 2, 10], r"^training\.rampup_batch_size\[0\]: .*must be <= global_batch_size \(8\)"),
    ([2, 4, 10], r"^training\.rampup_batch_size\[1\]: global_batch_size \(8\) - "
                 r"start_global_batch_size \(2\) must be divisible by batch_size_increment \(4\)"),
])
def test_rampup_invalid(rbs, match):
    with pytest.raises(ConfigError, match=match):
        load(global_batch_size=8, rampup_batch_size=rbs)


def test_rampup_valid():
    assert load(global_batch_size=8, rampup_batch_size=[2, 2, 100]).rampup_batch_size == \
        [2, 2, 100]


def test_config_error_is_value_error():
    with pytest.raises(ValueError):
        load(steps=0)
