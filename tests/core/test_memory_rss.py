"""The memory planner's estimate against the measured peak RSS of real CPU training runs.

Method: each run is a fresh subprocess (tests/core/rss_worker.py) that trains the config for
two optimizer steps through ``run_mindformer.py`` (checkpoints off) and reports its own peak
resident set, ``VmHWM`` of /proc/self/status. MindSpore's own footprint (libraries, kernels,
thread pools) is a framework baseline measured the same way on the 2-layer, 64-wide GPT of
``BASE``; its own (tiny) estimate is added back, so the comparison is

    measured = VmHWM(run) - VmHWM(baseline) + estimate(baseline)   vs   estimate(run)

for three model sizes, each within 25%, once with PyNative layers (``training.jit: none``) and
once under the default ``training.jit`` (``layer``: compiled layers, whose graph buffers are
the planner's "compiled-graph buffers", core/memory_jit.py). The baseline runs under the same
mode, so graph compilation's constant cost counts as framework footprint. The synthetic
corpus is kept at 64 tokens (its transition tables are V_markov^2 float64 and the planner does
not count data pipelines).
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from mindformers_core.config import load_config
from mindformers_core.core.memory_plan import plan_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "core", "rss_worker.py")
BASE = {"training": {"steps": 2, "local_batch_size": 4, "global_batch_size": 4, "max_norm": 1.0,
                     "seed": 1},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
        "model": {"model_type": "gpt", "vocab_size": 64, "hidden_size": 64, "num_layers": 2,
                  "num_attention_heads": 4, "seq_length": 64},
        # a 64-token Markov chain: the corpus' transition tables grow as its vocabulary squared
        # and are not part of the planner's estimate (data pipelines are not counted)
        "train_dataset": {"type": "SyntheticMarkov", "markov_vocab_size": 64},
        "checkpoint": {"enable_save": False}}
SIZES = {
    "small": {"vocab_size": 2048, "hidden_size": 256, "num_layers": 2, "num_attention_heads": 4,
              "seq_length": 256},
    "medium": {"vocab_size": 4096, "hidden_size": 384, "num_layers": 3,
               "num_attention_heads": 6, "seq_length": 384},
    "large": {"vocab_size": 4096, "hidden_size": 512, "num_layers": 4,
              "num_attention_heads": 8, "seq_length": 512},
}


def _config(tmp_path, name, model, jit):
    data = {k: dict(v) for k, v in BASE.items()}
    data["model"].update(model)
    if jit is not None:   # None: the default training.jit
        data["training"]["jit"] = jit
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def _peak(tmp_path, path, name):
    proc = subprocess.run([sys.executable, WORKER, path, str(tmp_path / f"out_{name}")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0
    return result["peak_rss"]


@pytest.mark.slow
@pytest.mark.parametrize("jit", ["none", None])
def test_estimate_matches_peak_rss_for_three_sizes(tmp_path, jit):
    base_path = _config(tmp_path, "baseline", {}, jit)
    base_cfg = load_config(base_path)
    assert base_cfg.model_jit_mode() == ("layer" if jit is None else jit)
    baseline = _peak(tmp_path, base_path, "baseline")
    base_estimate = plan_memory(base_cfg, 1).total
    rows = []
    for name, model in SIZES.items():
        path = _config(tmp_path, name, model, jit)
        estimate = plan_memory(load_config(path), 1).total
        measured = _peak(tmp_path, path, name) - baseline + base_estimate
        rows.append((name, estimate, measured, estimate / measured - 1))
    report = "; ".join(f"{n}: estimate {e / 2**20:.0f} MiB, measured {m / 2**20:.0f} MiB "
                       f"({r:+.0%})" for n, e, m, r in rows)
    print(report)
    assert all(abs(r) <= 0.25 for *_, r in rows), report
