"""Hostile values that used to escape the loader as tracebacks: each is a one-line
ConfigError naming its field, and ``--check`` exits 2 with it."""
import copy
import os
import subprocess
import sys

import pytest
import yaml

from mindformers_core.config import ConfigError, load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = yaml.safe_load(open(os.path.join(REPO, "configs", "quickstart.yaml"), encoding="utf-8"))
HUGE = int("9" * 400)
RESTARTS = {"type": "CosineWithRestartsAndWarmUpLR", "learning_rate": 1e-2}

CASES = {
    "steps_400_digits": (("training", "steps", HUGE), None,
                         r"^training\.steps: must be <= 9007199254740992, got 999999999999\.\.\. "
                         r"\(400 digits\)$"),
    "lr_end_400_digits": (("lr_scheduler", "lr_end", HUGE), None,
                          r"^lr_scheduler\.lr_end: must be a finite number, got 9+\.\.\. "
                          r"\(400 digits\)$"),
    "ns_coefficients_400_digits": (("optimizer", "ns_coefficients", [HUGE, 1.0, 1.0]),
                                   {"type": "Muon"},
                                   r"^optimizer\.ns_coefficients: flat ns_coefficients must hold "
                                   r"3 finite numbers, got \[9+\.\.\.\.$"),
    "lr_end_null": (("lr_scheduler", "lr_end", None), None,
                    r"^lr_scheduler\.lr_end: must not be null: write a number, or leave lr_end "
                    r"out for its default \(0\.0\)$"),
    "warmup_lr_init_null": (("lr_scheduler", "warmup_lr_init", None), None,
                            r"^lr_scheduler\.warmup_lr_init: must not be null"),
    "num_cycles_null": (("lr_scheduler", "num_cycles", None), RESTARTS,
                        r"^lr_scheduler\.num_cycles: must not be null: write a number, or leave "
                        r"num_cycles out for its default \(1\.0\)$"),
    "hidden_size_1e11": (("model", "hidden_size", 10 ** 11), None,
                         r"^model\.hidden_size: must be <= 1048576, got 100000000000$"),
    "num_cycles_1e308": (("lr_scheduler", "num_cycles", 1e308), RESTARTS,
                         r"^lr_scheduler\.num_cycles: must be <= 1000000, got 1e\+308$"),
}


def _config(case):
    (section, key, value), replace, _ = CASES[case]
    cfg = copy.deepcopy(BASE)
    if replace is not None:
        cfg[section] = dict(replace)
    cfg[section][key] = value
    return cfg


@pytest.mark.parametrize("case", sorted(CASES))
def test_loader_escape_is_a_config_error(case):
    with pytest.raises(ConfigError, match=CASES[case][2]) as info:
        load_config(_config(case))
    assert "\n" not in str(info.value)


def test_num_cycles_bound_keeps_the_schedule_finite():
    """The bound itself is usable: 1e6 cycles still give a finite lr at every step."""
    cfg = _config("num_cycles_1e308")
    cfg["lr_scheduler"]["num_cycles"] = 1e6
    from mindformers_core.core.lr import build_lr_scheduler
    run = load_config(cfg)
    sched = build_lr_scheduler(run.lr_scheduler, run.training.steps)
    assert all(0.0 <= sched.lr_at(s) <= 1e-2 for s in range(run.training.steps))


@pytest.mark.parametrize("case", ["steps_400_digits", "num_cycles_null", "num_cycles_1e308",
                                  "hidden_size_1e11"])
def test_check_exits_2_with_the_field(case, tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(_config(case)), encoding="utf-8")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "run_mindformer.py"), "--config",
                           str(path), "--check", "--mode", "1"], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=REPO))
    out = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    field = ".".join(CASES[case][0][:2])
    assert f"{field}:" in out.splitlines()[-1]
