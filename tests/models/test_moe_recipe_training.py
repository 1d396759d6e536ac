"""The tiny DeepSeek-V3 recipe (configs/muon_deepseek_v3_tiny.yaml) with the DeepSeek-V3
router options: 20 steps train (the loss falls), resume is bit-exact, and the MoE loads reach
metrics.jsonl and the step line every log_interval."""
import io
import json
import os

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
STEPS = 20


def _cfg(out, options, **training):
    sets = [f"training.steps={STEPS}", "training.log_interval=10", f"checkpoint.save_path={os.path.join(str(out), 'ckpt')}"]
    sets += [f"model.{k}={v}" for k, v in options.items()]
    sets += [f"training.{k}={v}" for k, v in training.items()]
    return load_config(RECIPE, sets)


def _run(cfg, out):
    stream = io.StringIO()
    trainer = Trainer(cfg, str(out), stream=stream)
    trainer.train()
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return trainer, [json.loads(x) for x in fh], stream.getvalue()


def _tensors(trainer):
    return {k: v for k, v in trainer.checkpoint_payload()[0].items()
            if k.startswith(("model.", "optim."))}


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"n_group": 2, "topk_group": 1},
                                     {"scoring_func": "softmax"}],
                         ids=["group_limited", "softmax"])
def test_recipe_trains_and_resumes_bit_exact(tmp_path, options):
    a, b = tmp_path / "a", tmp_path / "b"
    ta, rows_a, text = _run(_cfg(a, options), a)
    assert ta.model.moe_layers()[1].spec.n_group == options.get("n_group")
    losses = [r["loss"] for r in rows_a]
    assert len(losses) == STEPS
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses

    # observability: every log_interval (10) steps and the last one
    with_moe = [r for r in rows_a if "moe" in r]
    assert [r["step"] for r in with_moe] == [10, 20]
    layer = with_moe[0]["moe"]["layers"]["1"]                  # first_k_dense_replace = 1
    # the whole step: 2 micro-batches x 4 sequences x 32 tokens x k = 2
    assert sum(layer["tokens_per_expert"]) == 8 * 32 * 2
    load = np.array(layer["tokens_per_expert"])
    assert layer["imbalance"] == pytest.approx(load.max() / load.mean())
    assert layer["aux_loss"] > 0 and layer["dropped"] == 0
    assert text.count("moe_imbalance:") == 2

    run_b = _cfg(b, options, stop_at_step=10)
    _run(run_b, b)
    resumed = _cfg(b, options)
    resumed.checkpoint.load_path = str(b / "ckpt")
    tc, rows_b, _ = _run(resumed, b)
    assert [r["loss"] for r in rows_b] == losses
    fa, fc = _tensors(ta), _tensors(tc)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fc[k], err_msg=k)
    bias = [v for k, v in fa.items() if k.endswith("expert_bias")]
    assert bias and np.abs(bias[0]).max() > 0                 # the aux-free update ran
