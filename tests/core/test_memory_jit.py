"""Compiled-graph buffers of the memory planner (core/memory_jit.py): the item against its
formula from the per-layer activations, the modes and backends it applies to, and its error
path. The formula's factor itself is checked against measured peak RSS in
tests/core/test_memory_rss.py (slow)."""
import dataclasses

import pytest

from mindformers_core.config import load_config
from mindformers_core.config.context import ContextConfig
from mindformers_core.core import memory_plan as mp
from mindformers_core.core.memory_jit import (AST_ACTIVATION_FACTOR, COMPILED_ACTIVATION_FACTOR,
                                              compiled_graph_bytes, jit_capture_mode,
                                              planned_jit_mode)
from mindformers_core.core.memory_plan import ActivationSettings, Layout, estimate_memory

ITEM = "compiled-graph buffers"
BASE = {"training": {"steps": 10, "local_batch_size": 2, "global_batch_size": 2},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
        "model": {"model_type": "gpt", "vocab_size": 16, "hidden_size": 8, "num_layers": 2,
                  "num_attention_heads": 2, "ffn_hidden_size": 16, "seq_length": 4},
        "context": {"device_target": "CPU"}}
DEEPSEEK = {"model_type": "deepseek_v3", "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 6, "first_k_dense_replace": 1}


def cfg_of(**sections):
    data = {k: dict(v) for k, v in BASE.items()}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return load_config(data)


def test_default_jit_on_cpu_adds_factor_times_every_layer_activations():
    cfg = cfg_of()
    assert cfg.model_jit_mode() == "layer"
    plan = mp.plan_memory(cfg, 1, host_ram=2 ** 40, npu_visible=False)
    assert plan.settings.jit == "layer"
    parts = mp.layer_activation_bytes(cfg.model, Layout(), plan.settings, moe=False)
    assert plan.items[ITEM] == 2 * int(0.6 * sum(parts.values()))
    assert plan.items[ITEM] == 2 * int(0.6 * plan.items["activations"] / 2)
    none = mp.plan_memory(cfg_of(training={"jit": "none"}), 1, host_ram=2 ** 40,
                          npu_visible=False)
    assert ITEM not in none.items
    assert plan.total - none.total == plan.items[ITEM]


def test_jit_model_counts_the_same_and_moe_layers_count_only_their_compiled_attention():
    dense_layer = cfg_of(training={"jit": "model"})
    assert mp.plan_memory(dense_layer, 1, host_ram=2 ** 40).items[ITEM] == \
        mp.plan_memory(cfg_of(), 1, host_ram=2 ** 40).items[ITEM]
    ds = cfg_of(model=DEEPSEEK)
    plan = mp.plan_memory(ds, 1, host_ram=2 ** 40)
    st = plan.settings
    dense = mp.layer_activation_bytes(ds.model, Layout(), st, moe=False)
    moe = mp.layer_activation_bytes(ds.model, Layout(), st, moe=True)
    assert plan.items[ITEM] == int(0.6 * sum(dense.values())) \
        + int(0.6 * (moe["boundary"] + moe["attention"]))
    assert compiled_graph_bytes(moe, True, "model") == int(0.6 * sum(moe.values()))


def test_not_added_off_cpu_for_float16_or_recomputed_layers():
    cfg = cfg_of()
    ascend = dataclasses.replace(cfg, context=ContextConfig.from_dict(
        {"device_target": "Ascend"}, "context"))
    assert ITEM not in mp.plan_memory(ascend, 1).items
    assert mp.settings_from_config(cfg, Layout(), backend="GPU").jit == "none"
    # a null target with max_device_memory written is Ascend (its limit is that size)
    assert mp.plan_backend(ContextConfig.from_dict({"max_device_memory": "30GB"}, "context"),
                           npu_visible=False) == "Ascend"
    assert mp.plan_backend(ContextConfig.from_dict({}, "context"), npu_visible=False) == "CPU"
    assert mp.plan_backend(ContextConfig.from_dict({}, "context"), npu_visible=True) == "Ascend"
    assert planned_jit_mode("layer", "float16", "CPU") == "none"
    assert planned_jit_mode("layer", "bfloat16", "CPU") == "layer"
    full = cfg_of(recompute={"mode": "full"})
    assert full.model_jit_mode() == "none"
    assert ITEM not in mp.plan_memory(full, 1, host_ram=2 ** 40).items
    # recomputed layers (the verdict's recompute fix) keep no graph buffers
    st = dataclasses.replace(mp.settings_from_config(cfg, Layout()), recompute="full")
    assert estimate_memory(cfg, Layout(), st).items[ITEM] == 0


def test_factor_is_the_documented_one_and_mode_is_checked():
    assert COMPILED_ACTIVATION_FACTOR == 0.6
    with pytest.raises(ValueError, match=r"jit must be one of \('none', 'layer', 'model'\), "
                                         r"got 'graph'"):
        ActivationSettings(jit="graph")


def test_capture_mode_and_its_factor():
    assert jit_capture_mode((3, 11)) == "bytecode"
    assert jit_capture_mode((3, 12)) == "ast"
    parts = {"boundary": 100, "attention": 200, "mlp": 700}
    assert compiled_graph_bytes(parts, False, "layer", "bytecode") == int(0.6 * 1000)
    assert compiled_graph_bytes(parts, False, "layer", "ast") == int(AST_ACTIVATION_FACTOR * 1000)
    assert AST_ACTIVATION_FACTOR == 2.3
