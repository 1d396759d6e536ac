"""Memory planner (core/memory_plan.py): every formula against a closed form computed by hand
for a tiny config, the layout splits, the device limit and the verdict messages."""
import dataclasses
import os

import pytest
import yaml

from mindformers_core.config import load_config
from mindformers_core.config.context import ContextConfig
from mindformers_core.config.model import ModelConfig
from mindformers_core.config.recompute import RecomputeConfig
from mindformers_core.core import memory_plan as mp
from mindformers_core.core.memory_plan import (ActivationSettings, Layout, device_memory_limit,
                                               estimate_memory, param_counts,
                                               plan_memory)
from mindformers_core.core.memory_verdict import format_bytes, memory_verdict
from mindformers_core.tools.doctor import count_model_params, run_doctor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIB = 1024 ** 3

# tiny GPT: V 16, h 8, 2 layers, 2 heads (d 4), ffn 16, seq 4
TINY = {"training": {"steps": 10, "local_batch_size": 2, "global_batch_size": 2},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
        "model": {"model_type": "gpt", "vocab_size": 16, "hidden_size": 8, "num_layers": 2,
                  "num_attention_heads": 2, "ffn_hidden_size": 16, "seq_length": 4}}
# hand count: per layer norms 2*8 = 16, attention (4*2 + 2*2*4)*8 + 8*8 = 256,
# MLP 3*16*8 = 384 -> 656; embedding 128 + output 128 + final norm 8
TINY_PARAMS = 128 + 128 + 8 + 2 * (16 + 256 + 384)


def tiny(**sections):
    data = {k: dict(v) for k, v in TINY.items()}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return load_config(data)


# ------------------------------------------------------------------------ parameter counts
def test_tiny_gpt_param_count_by_hand():
    counts = param_counts(tiny().model)
    assert counts.total == TINY_PARAMS == 1576
    assert [(l.norms, l.attention, l.mlp, l.router, l.experts) for l in counts.layers] == \
        [(16, 256, 384, 0, 0)] * 2
    assert count_model_params(tiny().model) == TINY_PARAMS   # the doctor uses the same count


def test_tiny_deepseek_param_count_by_hand():
    m = ModelConfig.from_dict({
        "model_type": "deepseek_v3", "vocab_size": 16, "hidden_size": 8, "num_layers": 2,
        "num_attention_heads": 2, "ffn_hidden_size": 16, "q_lora_rank": 4, "kv_lora_rank": 4,
        "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2, "first_k_dense_replace": 1,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 6,
        "n_shared_experts": 1}, "model")
    # MLA: q down 4*8 + q up 2*4*4 = 64; kv down (4+2)*8 = 48, kv up 2*(2+2)*4 = 32, proj 8*4 = 32
    attn = 64 + 48 + 32 + 32
    norms = 2 * 8 + 4 + 4                                   # + q and kv layernorms
    dense = 3 * 16 * 8
    shared, router, experts = 3 * 6 * 8, 4 * 8, 4 * 3 * 6 * 8
    down = 4 * 8 + 48                                       # q and kv down: replicated under tp
    counts = param_counts(m)
    assert counts.layers[0] == mp.LayerParams(norms, attn, dense, 0, 0, 0, down)
    assert counts.layers[1] == mp.LayerParams(norms, attn, shared, router, experts, 4, down)
    # per tp rank (models/tp_plan.py): heads, a dense MLP and the shared experts split,
    # MLA's down projections, the router and the routed experts replicated (ep 1)
    assert counts.layers[0].per_rank(2, 1) == norms + (attn - down) // 2 + down + dense // 2
    assert counts.layers[1].per_rank(2, 1) == norms + (attn - down) // 2 + down + shared // 2 \
        + router + experts
    assert counts.total == 16 * 8 * 2 + 8 + 2 * (norms + attn) + dense + shared + router + experts


def test_deepseek_v3_671b_preset_has_671b_parameters():
    with open(os.path.join(ROOT, "configs", "model_presets", "deepseek_v3_671b.yaml")) as fh:
        m = ModelConfig.from_dict(yaml.safe_load(fh)["model"], "model")
    total = param_counts(m).total
    assert total == pytest.approx(671e9, rel=0.01)
    # DeepSeek-V3's 37B activated: routed experts count k/E of theirs
    counts = param_counts(m)
    routed = sum(l.experts for l in counts.layers)
    active = total - routed + routed * m.num_experts_per_tok / m.n_routed_experts
    assert active == pytest.approx(37e9, rel=0.03)


# ------------------------------------------------------------------------ state bytes
def test_state_bytes_fp32_adamw_by_hand():
    plan = estimate_memory(tiny(), Layout())
    n = TINY_PARAMS
    assert plan.items["parameters"] == 4 * n
    assert plan.items["gradients"] == 4 * n           # fp32 accumulation, no 16-bit raw grad
    assert plan.items["fp32 masters"] == 0
    assert plan.items["optimizer state"] == 8 * n     # m + v fp32


def test_state_bytes_bf16_params_and_moment_dtypes():
    cfg = tiny(model={"params_dtype": "bfloat16", "compute_dtype": "bfloat16"},
               optimizer={"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"})
    plan = estimate_memory(cfg, Layout())
    n = TINY_PARAMS
    assert plan.items["parameters"] == 2 * n
    assert plan.items["gradients"] == (4 + 2) * n
    assert plan.items["fp32 masters"] == 4 * n
    assert plan.items["optimizer state"] == 4 * n     # two bf16 moments
    rem = tiny(model={"params_dtype": "bfloat16"}, optimizer={"store_param_remainders": True})
    assert estimate_memory(rem, Layout()).items["fp32 masters"] == 2 * n


def test_muon_lion_sgd_state_by_hand():
    deepseek = {"model_type": "deepseek_v3", "multi_latent_attention": True}
    muon = tiny(optimizer={"type": "Muon"}, model=deepseek)
    counts = param_counts(muon.model)
    adamw_branch = counts.embedding + counts.output + counts.final_norm + \
        sum(l.norms for l in counts.layers)
    matrices = counts.total - adamw_branch
    assert estimate_memory(muon, Layout()).items["optimizer state"] == \
        4 * matrices + 8 * adamw_branch
    lion = tiny(optimizer={"type": "Lion"})
    assert estimate_memory(lion, Layout()).items["optimizer state"] == 4 * TINY_PARAMS
    sgd = tiny(optimizer={"type": "SGD", "sgd_momentum": 0.9})
    assert estimate_memory(sgd, Layout()).items["optimizer state"] == 4 * TINY_PARAMS
    plain = tiny(optimizer={"type": "SGD", "sgd_momentum": 0.0})
    assert estimate_memory(plain, Layout()).items["optimizer state"] == 0


@pytest.mark.parametrize("strategy,divided", [
    ("no_shard", ()), ("optim", ("fp32 masters", "optimizer state")),
    ("optim_grads", ("fp32 masters", "optimizer state", "gradients")),
    ("optim_grads_params", ("fp32 masters", "optimizer state", "gradients", "parameters"))])
def test_data_parallel_shard_strategies(strategy, divided):
    cfg = tiny(model={"params_dtype": "bfloat16"})
    one = estimate_memory(cfg, Layout()).items
    four = estimate_memory(cfg, Layout(dp=4, dp_shard=4, shard_strategy=strategy)).items
    for key in ("parameters", "gradients", "fp32 masters", "optimizer state"):
        want = one[key] // 4 if key in divided else one[key]
        assert four[key] == want, key


@pytest.mark.parametrize("strategy,shards", [("no_shard", 1), ("optim", 2),
                                             ("optim_grads", 4), ("optim_grads_params", 4)])
def test_fsdp_under_context_parallel_shards_over_dp_times_cp(strategy, shards):
    """cp x FSDP splits the state over the dp x cp ranks (distributed/fsdp.py), ZeRO-1 over
    the data_parallel_shard ranks, no_shard over none; the plan line says over how many."""
    cfg = tiny(model={"params_dtype": "bfloat16"})
    one = estimate_memory(cfg, Layout()).items
    lay = Layout(dp=2, cp=2, dp_shard=2, shard_strategy=strategy)
    assert lay.state_shards == shards and f"state sharded over {shards}," in lay.describe()
    got = estimate_memory(cfg, lay).items
    assert got["optimizer state"] == one["optimizer state"] // shards
    if strategy == "optim_grads_params":
        assert got["parameters"] == one["parameters"] // 4


def test_tensor_expert_and_pipeline_splits():
    cfg = tiny()
    counts = param_counts(cfg.model)
    tp2 = estimate_memory(cfg, Layout(tp=2))
    layer = counts.layers[0]
    want = (counts.embedding + counts.output) // 2 + counts.final_norm + \
        2 * (layer.norms + layer.attention // 2 + layer.mlp // 2)
    assert tp2.params_per_rank == want
    # pp 2: stage 0 holds the embedding and layer 0, stage 1 layer 1, the final norm, the
    # output layer and the logits: stage 1 is the busiest
    pp2 = estimate_memory(cfg, Layout(pp=2))
    assert pp2.params_per_rank == counts.output + counts.final_norm + layer.total
    assert pp2.stage_layers == 1 and pp2.stage == 1
    assert pp2.items["logits/CE workspace"] > 0
    # ep 2 halves the routed experts of a MoE layer
    ds = tiny(model={"model_type": "deepseek_v3", "n_routed_experts": 4, "num_layers": 2,
                     "first_k_dense_replace": 1})
    c = param_counts(ds.model)
    ep2 = estimate_memory(ds, Layout(dp=2, ep=2, dp_shard=2))
    assert ep2.params_per_rank == c.total - c.layers[1].experts // 2


def test_expert_state_stays_whole_under_expert_parallel_zero():
    """ZeRO-1 over dp 4 with ep 2: the dense state is divided by 4, the routed experts'
    master and state are not (their ZeRO group holds other experts: ZeroSharding.keep_whole,
    distributed/ep_reduce.py)."""
    ds = tiny(model={"model_type": "deepseek_v3", "n_routed_experts": 4, "num_layers": 2,
                     "first_k_dense_replace": 1, "params_dtype": "bfloat16"})
    c = param_counts(ds.model)
    plan = estimate_memory(ds, Layout(dp=4, ep=2, dp_shard=4))
    experts = c.layers[1].experts // 2
    dense = plan.params_per_rank - experts
    assert plan.items["fp32 masters"] == dense * 4 // 4 + experts * 4
    # AdamW fp32 m + v: 8 bytes per parameter on every branch
    assert plan.items["optimizer state"] == dense * 8 // 4 + experts * 8
    # without expert parallel every parameter's state is sharded
    plain = estimate_memory(ds, Layout(dp=4, dp_shard=4))
    assert plain.items["fp32 masters"] == plain.params_per_rank * 4 // 4


def test_fsdp_is_not_suggested_under_expert_parallel():
    """config/layout.py refuses FSDP with expert parallel, so the verdict never offers it."""
    ds = tiny(model={"model_type": "deepseek_v3", "n_routed_experts": 4, "num_layers": 2,
                     "first_k_dense_replace": 1})
    plan = _with_limit(estimate_memory(ds, Layout(dp=4, ep=2, dp_shard=4)), 1.0)
    _, _, suggestion = memory_verdict(plan, ds)
    assert "data_parallel_shard_strategy" not in suggestion
    plan = _with_limit(estimate_memory(ds, Layout(dp=4, dp_shard=4)), 1.0)
    assert "parallelism.data_parallel_shard_strategy: optim_grads" in memory_verdict(plan, ds)[2]


def test_pipeline_stages_split_contiguously():
    assert [list(r) for r in mp.pipeline_stages(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [len(r) for r in mp.pipeline_stages(61, 8)] == [8, 8, 8, 8, 8, 7, 7, 7]


@pytest.mark.parametrize("kwargs,message", [
    ({"dp": 0}, "layout.dp must be >= 1, got 0"),
    ({"dp": 4, "dp_shard": 3}, "layout.dp_shard(3) must divide dp(4)"),
    ({"shard_strategy": "zero3"}, "layout.shard_strategy must be one of"),
    ({"ep": 2}, "layout.ep(2) must divide dp*tp*cp (1)"),
])
def test_layout_errors(kwargs, message):
    with pytest.raises(ValueError) as exc:
        Layout(**kwargs)
    assert message in str(exc.value)


def test_estimate_errors():
    ds = tiny(model={"model_type": "deepseek_v3", "n_routed_experts": 4})
    with pytest.raises(ValueError, match=r"layout.ep\(8\) must divide n_routed_experts \(4\)"):
        estimate_memory(ds, Layout(dp=8, ep=8, dp_shard=8))
    with pytest.raises(ValueError, match=r"layout.pp\(3\) must be <= num_layers\(2\)"):
        estimate_memory(tiny(), Layout(pp=3))
    with pytest.raises(ValueError, match="recompute must be 'none', 'full' or 'selective'"):
        ActivationSettings(recompute="all")
    with pytest.raises(ValueError, match="moe_dispatch must be 'dense' or 'alltoall'"):
        ActivationSettings(moe_dispatch="sparse")
    with pytest.raises(ValueError, match="micro_batch and num_micro_batches must be >= 1"):
        ActivationSettings(micro_batch=0)


# ------------------------------------------------------------------------ config settings
def test_recompute_layers_come_from_the_one_layer_selection():
    """The planner counts the layers core/recompute.py selects (the same rule the model
    applies), including upstream's string form."""
    base = {"training": {"steps": 2, "local_batch_size": 1, "global_batch_size": 1,
                         "jit": "none"},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"num_layers": 6}}
    for spec, n in ((None, 6), (3, 3), ([0, "2-4", 4], 4), ("[0-1]", 2)):
        cfg = load_config({**base, "recompute": {"mode": "full", "full_recompute_layer": spec}})
        settings = mp.settings_from_config(cfg, mp.layout_from_config(cfg, 1))
        assert settings.recompute == "full"
        assert settings.recompute_layers == (None if spec is None else n)


def test_settings_from_config_reads_recompute_and_batch():
    cfg = tiny(training={"local_batch_size": 1, "global_batch_size": 4})
    st = mp.settings_from_config(cfg, Layout())
    assert (st.micro_batch, st.num_micro_batches, st.recompute, st.flash_attention) == \
        (1, 4, "none", False)
    full = dataclasses.replace(cfg, recompute=RecomputeConfig(mode="full",
                                                              full_recompute_layer=["0-0"]))
    st = mp.settings_from_config(full, Layout())
    assert (st.recompute, st.recompute_layers) == ("full", 1)
    sel = dataclasses.replace(cfg, recompute=RecomputeConfig(mode="selective"))
    assert mp.settings_from_config(sel, Layout()).recompute == "selective"
    assert mp.settings_from_config(cfg, Layout(dp=2, ep=2, dp_shard=2)).moe_dispatch == "alltoall"


# ------------------------------------------------------------------------ device memory
def _ctx(**kw):
    return ContextConfig.from_dict(kw, "context")


def test_device_limit_sources():
    assert device_memory_limit(_ctx(device_target="CPU", max_device_memory="8GB"),
                               host_ram=5e9) == (5e9, "host RAM (CPU)")
    assert device_memory_limit(_ctx(device_target="Ascend"), host_ram=5e9) == \
        (59 * GIB, "context.max_device_memory 59GB")
    assert device_memory_limit(_ctx(device_target="Ascend", max_device_memory="80GB"))[0] == \
        64 * GIB
    assert "Ascend 910B HBM (64 GB" in device_memory_limit(
        _ctx(device_target="Ascend", max_device_memory="80GB"))[1]
    assert device_memory_limit(_ctx(device_target="GPU", max_device_memory="80GB"))[0] == 80 * GIB
    assert device_memory_limit(_ctx(max_device_memory="30GB"), host_ram=5e9,
                               npu_visible=False)[0] == 30 * GIB
    assert device_memory_limit(_ctx(), host_ram=5e9, npu_visible=True)[0] == 59 * GIB
    assert device_memory_limit(_ctx(), host_ram=5e9, npu_visible=False) == (5e9, "host RAM (CPU)")


# ------------------------------------------------------------------------ verdicts
def _with_limit(plan, limit, source="test limit"):
    plan.limit, plan.limit_source = limit, source
    return plan


def test_verdict_pass_warn_fail_thresholds():
    cfg = tiny()
    plan = estimate_memory(cfg, Layout())
    total = plan.total
    status, reason, suggestion = memory_verdict(_with_limit(plan, total / 0.9), cfg)
    assert status == "PASS" and "90% of" in reason and suggestion == ""
    status, reason, suggestion = memory_verdict(_with_limit(plan, total / 0.95), cfg)
    assert status == "WARN" and "above 90%" in reason and "biggest item" in reason
    status, reason, _ = memory_verdict(_with_limit(plan, total - 1), cfg)
    assert status == "FAIL" and "exceeds the device" in reason
    assert memory_verdict(_with_limit(plan, None, "host RAM unknown"), cfg)[:2] == \
        ("WARN", f"{format_bytes(total)} per rank ({plan.layout.describe()}; 1.58K of 1.58K "
                 "parameters); device memory unknown (host RAM unknown)")


def test_fail_names_biggest_item_and_cheapest_fix_shard():
    cfg = tiny(model={"params_dtype": "bfloat16"})
    plan = estimate_memory(cfg, Layout(dp=4, dp_shard=1))
    sharded = estimate_memory(cfg, Layout(dp=4, dp_shard=4))
    plan = _with_limit(plan, (plan.total + sharded.total) / 2)
    status, reason, suggestion = memory_verdict(plan, cfg)
    big = max(plan.items, key=plan.items.get)
    assert status == "FAIL"
    assert f"biggest item {big} {format_bytes(plan.items[big])}" in reason
    assert suggestion == ("parallelism.data_parallel_shard: -1 (shard the optimizer state over "
                          f"all 4 data-parallel ranks) -> {format_bytes(sharded.total)} "
                          "per rank")


def test_fail_names_recompute_when_activations_dominate():
    cfg = tiny(model={"seq_length": 16, "hidden_size": 64, "ffn_hidden_size": 256,
                      "num_layers": 8}, training={"local_batch_size": 1, "global_batch_size": 1})
    plan = estimate_memory(cfg, Layout())
    full = estimate_memory(cfg, Layout(), dataclasses.replace(plan.settings, recompute="full"))
    selective = estimate_memory(cfg, Layout(),
                                dataclasses.replace(plan.settings, recompute="selective"))
    flash = estimate_memory(cfg, Layout(),
                            dataclasses.replace(plan.settings, flash_attention=True))
    assert full.total < min(selective.total, flash.total)
    _, _, suggestion = memory_verdict(_with_limit(plan, (full.total + min(
        selective.total, flash.total)) / 2), cfg)
    assert suggestion == f"recompute.mode: full -> {format_bytes(full.total)} per rank"


def test_fail_names_smaller_micro_batch_first():
    cfg = tiny(training={"local_batch_size": 8, "global_batch_size": 8},
               model={"seq_length": 64})
    plan = estimate_memory(cfg, Layout())
    half = estimate_memory(cfg, Layout(), dataclasses.replace(plan.settings, micro_batch=4,
                                                              num_micro_batches=2))
    _, _, suggestion = memory_verdict(_with_limit(plan, half.total + 1), cfg)
    assert suggestion.startswith("training.local_batch_size: 4 (a smaller micro-batch")


def test_671b_on_one_process_fails_with_model_parallel_advice():
    cfg = load_config(os.path.join(ROOT, "configs", "npu", "deepseek_v3_adamw.yaml"))
    plan = plan_memory(cfg, 1, host_ram=64 * GIB, npu_visible=False)
    status, reason, suggestion = memory_verdict(plan, cfg)
    assert status == "FAIL"
    assert reason.startswith(f"{format_bytes(plan.total)} per rank (dp 1")
    assert "671B of 671B parameters" in reason and "biggest item optimizer state" in reason
    assert suggestion.startswith("no single fix fits: parameters, gradients and optimizer "
                                 "state alone take")
    assert "more model parallelism (tensor/pipeline/expert parallel)" in suggestion


def test_doctor_reports_the_memory_verdict():
    verdicts = {v.item: v for v in run_doctor(tiny(), inspect_model=False)}
    assert verdicts["memory"].status == "PASS"
    assert "per rank" in verdicts["memory"].reason


# ------------------------------------------------------------------------ activations
# tiny: b 2, s 4, h 8, n 2 heads of d 4, f 16, V 16, float32 compute (c = 4)
def test_gpt_layer_activations_by_hand():
    cfg = tiny()
    st = mp.settings_from_config(cfg, Layout())
    parts = mp.layer_activation_bytes(cfg.model, Layout(), st, moe=False)
    b, s, h, n, d, f, c = 2, 4, 8, 2, 4, 16, 4
    assert parts["boundary"] == b * s * h * (4 * 4 + 2 * c)
    assert parts["attention"] == b * s * d * c * (3 * n + 2 * n + 2 * n + n) + b * n * s * s * 4
    assert parts["mlp"] == b * s * f * 6 * c
    plan = estimate_memory(cfg, Layout())
    assert plan.items["activations"] == 2 * sum(parts.values())
    assert plan.items["logits/CE workspace"] == b * s * 16 * 12


def test_flash_attention_and_recompute_by_hand():
    cfg = tiny()
    st = mp.settings_from_config(cfg, Layout())
    b, s, h, n, c = 2, 4, 8, 2, 4
    plain = mp.layer_activation_bytes(cfg.model, Layout(), st, moe=False)
    flash = mp.layer_activation_bytes(cfg.model, Layout(),
                                      dataclasses.replace(st, flash_attention=True), moe=False)
    # flash keeps the float32 log-sum-exp [b, n, s] instead of the [b, n, s, s] probabilities
    assert plain["attention"] - flash["attention"] == b * n * s * s * 4 - b * n * s * 4
    layer = sum(plain.values())
    full = estimate_memory(cfg, Layout(), dataclasses.replace(st, recompute="full"))
    assert full.items["activations"] == 2 * b * s * h * c          # the layers' inputs only
    assert full.items["recompute workspace"] == layer               # one layer re-run at a time
    one = estimate_memory(cfg, Layout(), dataclasses.replace(st, recompute="full",
                                                             recompute_layers=1))
    assert one.items["activations"] == b * s * h * c + layer
    sel = estimate_memory(cfg, Layout(), dataclasses.replace(st, recompute="selective"))
    assert sel.items["activations"] == 2 * (layer - b * n * s * s * 4)
    assert "recompute workspace" not in sel.items


def test_bf16_compute_adds_the_16_bit_copies():
    cfg = tiny(model={"params_dtype": "bfloat16", "compute_dtype": "bfloat16"})
    st = mp.settings_from_config(cfg, Layout())
    b, s, n, V = 2, 4, 2, 16
    parts = mp.layer_activation_bytes(cfg.model, Layout(), st, moe=False)
    fp32 = mp.layer_activation_bytes(tiny().model, Layout(), st, moe=False)
    core16 = b * n * s * s * (4 + 2)
    assert parts["attention"] - core16 == (fp32["attention"] - b * n * s * s * 4) // 2
    assert mp.logits_bytes(cfg.model, Layout(), st) == b * s * V * (12 + 2)


def test_tensor_and_sequence_parallel_split_activations():
    cfg = tiny()
    st = mp.settings_from_config(cfg, Layout())
    one = mp.layer_activation_bytes(cfg.model, Layout(), st, moe=False)
    tp2 = mp.layer_activation_bytes(cfg.model, Layout(tp=2), st, moe=False)
    sp2 = mp.layer_activation_bytes(cfg.model, Layout(tp=2, sequence_parallel=True), st,
                                    moe=False)
    assert tp2["boundary"] == one["boundary"] and sp2["boundary"] == one["boundary"] // 2
    assert tp2["attention"] == one["attention"] // 2 and tp2["mlp"] == one["mlp"] // 2
    assert mp.logits_bytes(cfg.model, Layout(tp=2), st) == mp.logits_bytes(
        cfg.model, Layout(), st) // 2


def test_moe_dispatch_by_hand():
    cfg = tiny(model={"model_type": "deepseek_v3", "n_routed_experts": 4,
                      "num_experts_per_tok": 2, "moe_intermediate_size": 6})
    st = mp.settings_from_config(cfg, Layout())
    t, e, k, f, h, c = 2 * 4, 4, 2, 6, 8, 4
    router = 4 * t * e * (2 + k + 1)
    assert mp.moe_dispatch_bytes(cfg.model, Layout(), st) == router + e * t * (2 * h + 5 * f) * c
    a2a = dataclasses.replace(st, moe_dispatch="alltoall")
    assert mp.moe_dispatch_bytes(cfg.model, Layout(dp=2, ep=2, dp_shard=2), a2a) == \
        router + k * t * (3 * h + 5 * f) * c
    plan = estimate_memory(cfg, Layout())
    assert plan.items["MoE dispatch buffers"] == mp.moe_dispatch_bytes(cfg.model, Layout(), st)


def test_pipeline_keeps_micro_batches_in_flight():
    cfg = tiny(training={"local_batch_size": 1, "global_batch_size": 8})
    st = mp.settings_from_config(cfg, Layout())
    layer = sum(mp.layer_activation_bytes(cfg.model, Layout(), st, moe=False).values())
    pp2 = estimate_memory(cfg, Layout(pp=2))
    # stage 0 (1 layer) keeps min(pp, 8) = 2 micro-batches, stage 1 one
    assert pp2.stage == 0 and pp2.items["activations"] == 2 * layer
    per_stage = [mp.stage_items(cfg.model, param_counts(cfg.model), Layout(pp=2), st,
                                 mp.optimizer_state_from_config(cfg.optimizer, "float32"), i, r)
                 [0]["activations"] for i, r in enumerate(mp.pipeline_stages(2, 2))]
    assert per_stage == [2 * layer, layer]


def test_backward_workspace_and_clipping_copy_by_hand():
    b, s, n = 2, 4, 2
    plain = estimate_memory(tiny(training={"max_norm": None}), Layout())
    assert plain.items["backward workspace"] == 2 * b * n * s * s * 4
    assert "gradient clipping copy" not in plain.items
    flash = estimate_memory(tiny(), Layout(), dataclasses.replace(plain.settings,
                                                                  flash_attention=True))
    assert "backward workspace" not in flash.items
    clipped = estimate_memory(tiny(training={"max_norm": 1.0}), Layout())
    assert clipped.items["gradient clipping copy"] == 4 * TINY_PARAMS
    sharded = estimate_memory(tiny(training={"max_norm": 1.0}),
                              Layout(dp=2, dp_shard=2, shard_strategy="optim_grads"))
    assert sharded.items["gradient clipping copy"] == 4 * TINY_PARAMS // 2


def test_mla_layer_activations_by_hand():
    cfg = tiny(model={"model_type": "deepseek_v3", "multi_latent_attention": True,
                      "q_lora_rank": 4, "kv_lora_rank": 4, "qk_nope_head_dim": 2,
                      "qk_rope_head_dim": 2, "v_head_dim": 2, "n_routed_experts": 4,
                      "moe_intermediate_size": 6, "n_shared_experts": 1})
    st = mp.settings_from_config(cfg, Layout())
    b, s, n, c = 2, 4, 2, 4
    per_head = 2 * (2 + 2) + 2 + (2 + 2) + 2        # q, k, v, kv_up output, context
    latent = 4 + 2 + 4                               # c_kv, k_pe, q down-projection
    parts = mp.layer_activation_bytes(cfg.model, Layout(), st, moe=True)
    assert parts["attention"] == b * s * (n * per_head * c + latent * (4 + c)) + \
        b * n * s * s * 4
    assert parts["mlp"] == b * s * 6 * 6 * c         # the shared expert, width 1 x 6


def test_verdict_without_config_and_the_table_text():
    from mindformers_core.core.memory_verdict import format_memory_plan
    plan = _with_limit(estimate_memory(tiny(), Layout()), 1000, "test limit")
    assert memory_verdict(plan)[0::2] == (
        "FAIL", "recompute, a larger data_parallel_shard or a smaller micro-batch")
    lines = format_memory_plan(plan).splitlines()
    assert lines[0] == ("memory plan (per rank, dp 1 (state sharded over 1, optim), tp 1, pp 1, "
                        "ep 1, cp 1; micro-batch 2, recompute none, flash attention off, "
                        "busiest pipeline stage 0 with 2 layers)")
    assert lines[1].split() == ["parameters", "held", "1.58K", "(of", "1.58K;", "tp", "1)"]
    assert lines[2].split() == ["parameters", format_bytes(4 * TINY_PARAMS).split()[0],
                                format_bytes(4 * TINY_PARAMS).split()[1]]
    assert lines[-2].split()[0] == "total"
    assert lines[-1].startswith("  limit") and f"(test limit; {plan.total / 1000:.0%} used)" \
        in lines[-1]


def test_the_ulysses_core_holds_its_heads_share_of_the_whole_sequence(monkeypatch):
    """Under cp the core's probabilities are b x n x (s/cp)^2 (the chunks' block); under
    ulysses of degree u the all-to-all gives it n/u heads of s/cp*u tokens, b x n/u x (s/cp*u)^2
    (measured: bench/bench_cp_memory.py --method ulysses)."""
    cfg = tiny()
    st = mp.settings_from_config(cfg, Layout())
    b, s, n = 2, 4, 2
    lay = Layout(cp=2)
    ring = mp.layer_activation_bytes(cfg.model, lay, st, moe=False)
    uly = mp.layer_activation_bytes(cfg.model, lay, dataclasses.replace(st, ulysses=2),
                                    moe=False)
    assert uly["attention"] - ring["attention"] == \
        b * (n // 2) * s * s * 4 - b * n * (s // 2) ** 2 * 4
    assert uly["boundary"] == ring["boundary"] and uly["mlp"] == ring["mlp"]
    # from the config: ulysses all-to-alls over the cp ranks, colossal not at all
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    for method, degree in (("ulysses", 2), ("colossal", 1)):
        cp2 = tiny(parallelism={"context_parallel": 2, "context_parallel_method": method})
        assert mp.settings_from_config(cp2, lay).ulysses == degree
    with pytest.raises(ValueError, match=r"^ulysses must be >= 1, got 0$"):
        dataclasses.replace(st, ulysses=0)
