"""A run with ``optimizer.mup`` builds the muP model (readout 1/w, hidden init / sqrt(w)) and
the muP optimizer groups, logs the width multiplier, and trains."""
import io
import json
import math
import os

import numpy as np

from mindformers_core.config import load_config
from mindformers_core.models import build_model
from mindformers_core.trainer import Trainer


def mup_cfg(out, mup=True):
    data = {
        "training": {"steps": 12, "local_batch_size": 4, "global_batch_size": 4,
                     "max_norm": 1.0, "seed": 3},
        "optimizer": {"type": "AdamW", "weight_decay": 0.0},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1.e-2, "warmup_steps": 0},
        "model": {"model_type": "gpt", "vocab_size": 32, "hidden_size": 32, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 16},
        "train_dataset": {"type": "SyntheticMarkov", "markov_order": 1},
    }
    if mup:
        data["optimizer"]["mup"] = {"base_hidden_size": 8}
    return load_config(data)


def test_mup_run_builds_the_mup_model_and_trains(tmp_path):
    cfg, stream = mup_cfg(tmp_path), io.StringIO()
    t = Trainer(cfg, str(tmp_path), stream=stream)
    w = 32 / 8
    assert t.mup_width_mult == w and t.model.readout_multiplier == 1.0 / w
    # the model is build_model(..., mup_width_mult=w): hidden matrices std / sqrt(w)
    plain = {p.name: p.asnumpy() for p in build_model(cfg.model, seed=3).get_parameters()}
    for p in t.model.get_parameters():
        hidden = len(p.shape) >= 2 and "embeddings" not in p.name and "output_layer" not in p.name
        np.testing.assert_allclose(p.asnumpy(), plain[p.name] / (math.sqrt(w) if hidden else 1.0),
                                   rtol=1e-6, err_msg=p.name)
    # the optimizer's half: hidden matrices lr x 1/w and eps x 1/w, the rest at the base
    mults = {}
    for g in t.optimizer.param_groups:
        for p in g["params"]:
            mults[p.name] = (g.get("lr_mult", 1.0), g.get("eps"))
    assert mults["decoder.layers.0.mlp.linear_fc1.weight"][0] == 1.0 / w
    assert mults["decoder.layers.0.mlp.linear_fc1.weight"][1] == 1e-8 / w
    assert mults["output_layer.weight"][0] == 1.0
    assert mults["embedding.word_embeddings.weight"][0] == 1.0

    assert t.train() == "finished"
    assert "muP              : width_mult 4 (hidden_size 32 / base 8); logits x 0.25" \
        in stream.getvalue()
    with open(os.path.join(str(tmp_path), "metrics.jsonl")) as fh:
        losses = [json.loads(x)["loss"] for x in fh]
    assert len(losses) == 12 and all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < losses[0] - 0.3, losses


def test_no_mup_section_builds_the_plain_model(tmp_path):
    cfg = mup_cfg(tmp_path, mup=False)
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert t.mup_width_mult is None and t.model.readout_multiplier is None
    plain = {p.name: p.asnumpy() for p in build_model(cfg.model, seed=3).get_parameters()}
    for p in t.model.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), plain[p.name], err_msg=p.name)
