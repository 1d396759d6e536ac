"""Parameter groups on the real models (`build_model`) with configs loaded from YAML-like dicts."""
import pytest

from mindformers_core.config import load_config
from mindformers_core.models import build_model
from mindformers_core.optim.muon_routing import muon_routing
from mindformers_core.optim.param_groups import format_param_group_table, get_param_groups


def _load(model_type, optimizer):
    return load_config({"training": {"steps": 10}, "model": {"model_type": model_type},
                        "optimizer": optimizer,
                        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 1e-3}})


@pytest.mark.parametrize("model_type, optimizer", [
    ("gpt", {"type": "AdamW", "weight_decay": 0.1}),
    ("deepseek_v3", {"type": "Muon"}),
])
def test_real_models_group_every_trainable_parameter_once(model_type, optimizer):
    cfg = _load(model_type, optimizer)
    model = build_model(cfg.model)
    groups = get_param_groups(model, cfg.optimizer)
    trainable = [p for p in model.trainable_params()]
    grouped = [p for g in groups for p in g["params"]]
    assert sorted(id(p) for p in grouped) == sorted(id(p) for p in trainable)
    wd = {p.name: g["weight_decay"] * g["wd_mult"] for g in groups for p in g["params"]}
    base = cfg.optimizer.weight_decay
    for p in trainable:                       # upstream default rule as the reference
        expected = 0.0 if len(p.shape) == 1 or p.name.endswith(".bias") else base
        assert wd[p.name] == expected, p.name
    if optimizer["type"] == "Muon":
        kind = {p.name: g["optimizer"] for g in groups for p in g["params"]}
        muon, adamw = muon_routing([(p.name, p) for p in trainable])
        assert {n for n in kind if kind[n] == "muon"} == set(muon)
        assert kind["embedding.word_embeddings.weight"] == kind["output_layer.weight"] == "adamw"
    # a second build gives the same table (same names, shapes, group order)
    again = get_param_groups(build_model(cfg.model), cfg.optimizer)
    assert format_param_group_table(groups) == format_param_group_table(again)


def test_real_model_mup_reads_hidden_size_from_the_model():
    cfg = _load("gpt", {"type": "AdamW", "mup": {"base_hidden_size": 16}})
    model = build_model(cfg.model)
    w = cfg.model.hidden_size / 16
    groups = get_param_groups(model, cfg.optimizer)
    for g in groups:
        for p in g["params"]:
            hidden = len(p.shape) >= 2 and "word_embeddings" not in p.name and "output_layer" not in p.name
            assert g["lr_mult"] == (1.0 / w if hidden else 1.0), p.name
            assert g.get("eps") == (pytest.approx(1e-8 / w) if hidden else None), p.name
