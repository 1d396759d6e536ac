"""``recompute: {mode: select}`` through the Trainer: the config's parts are recomputed in the
built model and three steps train exactly as without recompute (same losses, MTP losses and
grad norms, bit for bit)."""
import os

import pytest

from mindformers_core.config import load_config
from mindformers_core.config.yaml_io import load_yaml_text
from mindformers_core.models.transformer_layer import RecomputedCore
from mindformers_core.trainer import Trainer

from test_trainer import rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(out, recompute):
    with open(os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")) as fh:
        data = load_yaml_text(fh.read())
    data["training"].update({"steps": 3, "deterministic": True})
    data["model"].update({"num_nextn_predict_layers": 1})
    data["checkpoint"].update({"enable_save": False})
    if recompute:
        data["recompute"] = recompute
    return load_config(data)


@pytest.mark.slow
def test_select_mode_recomputes_the_parts_and_trains_identically(tmp_path):
    select = {"mode": "select", "select_module": {"layers.*.self_attention.core_attention": [0],
                                                  "layers.*.mlp.*": ["0-1"]}}
    cfg = _cfg(tmp_path / "sel", select)
    assert cfg.recompute_modules() == {0: ("self_attention.core_attention", "mlp"),
                                       1: ("mlp",)}
    t = Trainer(cfg, str(tmp_path / "sel"))
    first, second = t.model.decoder.layers
    assert isinstance(first.self_attention.core_attention, RecomputedCore)
    assert not isinstance(second.self_attention.core_attention, RecomputedCore)
    assert t.model.jit_mode == "none"
    t.train()
    plain = _cfg(tmp_path / "plain", None)
    plain.training.jit = "none"
    Trainer(plain, str(tmp_path / "plain")).train()
    keys = ("loss", "mtp_loss", "grad_norm")
    assert [[r[k] for k in keys] for r in rows(tmp_path / "sel")] == \
        [[r[k] for k in keys] for r in rows(tmp_path / "plain")]
