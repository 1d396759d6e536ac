"""`parallelism.tensor_parallel > 1`: sequence parallel required (upstream's text), the model
sizes tp splits, the B*S token split, `--check` exit 2 on each
(config/tensor_parallel_rules.py), and the per-rank plan."""
import os
import subprocess
import sys

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.tensor_parallel_rules import (check_divisible_by_tp,
                                                           check_sequence_parallel,
                                                           check_sequence_tokens)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKOV = os.path.join(ROOT, "configs", "markov_check.yaml")
DSV3 = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
TP2 = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"]


@pytest.fixture
def world2(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")


def test_pure_rules_give_upstream_messages():
    with pytest.raises(ValueError, match=r"^PyNative tensor parallelism requires "
                                         r"sequence_parallel=True when tensor_parallel > 1, but "
                                         r"got tensor_parallel=2\.$"):
        check_sequence_parallel(2, False)
    check_sequence_parallel(2, True)
    check_sequence_parallel(1, False)
    with pytest.raises(ValueError, match=r"^num_attention_heads \(6\) must be a multiple of "
                                         r"tensor_model_parallel_size \(4\)\.$"):
        check_divisible_by_tp("num_attention_heads", 6, 4)
    check_divisible_by_tp("num_attention_heads", 8, 4)
    with pytest.raises(ValueError, match=r"local_batch_size \(1\) \* seq_length \(15\) = 15 must "
                                         r"be divisible by tensor_model_parallel_size \(2\)"):
        check_sequence_tokens(1, 15, 2)
    check_sequence_tokens(1, 16, 2)


def test_tp2_with_sequence_parallel_is_accepted_and_planned(world2):
    cfg = load_config(MARKOV, overrides=TP2)
    plan = cfg.plan()
    assert (plan.world_size, plan.data_parallel, plan.tensor_parallel) == (2, 1, 2)
    assert plan.sequence_parallel
    assert "tensor parallel  : 2 (sequence parallel)" in plan.format()


def test_tp_with_sequence_parallel_false_is_refused_with_upstream_text(world2):
    with pytest.raises(ConfigError, match=r"^parallelism\.sequence_parallel: PyNative tensor "
                                          r"parallelism requires sequence_parallel=True when "
                                          r"tensor_parallel > 1, but got tensor_parallel=2\."):
        load_config(MARKOV, overrides=["parallelism.tensor_parallel=2",
                                       "parallelism.sequence_parallel=false"])


def test_an_unwritten_sequence_parallel_follows_tensor_parallel(world2):
    """Upstream's parallel-training guide: "SP is automatically enabled with TP" (its
    tensor-parallel examples write no sequence_parallel)."""
    cfg = load_config(MARKOV, overrides=["parallelism.tensor_parallel=2"])
    assert cfg.parallelism.sequence_parallel is True and cfg.plan().sequence_parallel
    assert load_config(MARKOV).parallelism.sequence_parallel is False


@pytest.mark.parametrize("override,field,text", [
    ("model.num_attention_heads=1", "model.num_attention_heads",
     r"num_attention_heads \(1\) must be a multiple of tensor_model_parallel_size \(2\)"),
    ("model.num_query_groups=1", "model.num_query_groups",
     r"num_query_groups \(1\) must be a multiple of tensor_model_parallel_size \(2\)"),
    ("model.ffn_hidden_size=75", "model.ffn_hidden_size",
     r"ffn_hidden_size \(75\) must be a multiple of tensor_model_parallel_size \(2\)"),
    ("model.vocab_size=33", "model.vocab_size",
     r"vocab_size \(33\) must be a multiple of tensor_model_parallel_size \(2\)"),
])
def test_sizes_tp_splits_must_divide(world2, override, field, text):
    with pytest.raises(ConfigError, match=rf"^{field}: {text}"):
        load_config(MARKOV, overrides=TP2 + [override])


def test_sequence_parallel_token_split(world2):
    with pytest.raises(ConfigError, match=r"^training\.local_batch_size: With sequence "
                                          r"parallelism, the tokens of a micro-batch "
                                          r"local_batch_size \(1\) \* seq_length \(15\) = 15"):
        load_config(MARKOV, overrides=TP2 + ["model.seq_length=15", "training.local_batch_size=1",
                                             "training.global_batch_size=2"])


def dsv3_adamw(overrides):
    import yaml
    with open(DSV3) as fh:
        d = yaml.safe_load(fh)
    d["optimizer"] = {"type": "AdamW", "weight_decay": 0.1}
    return load_config(d, overrides=overrides)


def test_muon_and_mtp_under_tp_are_accepted(world2):
    cfg = load_config(DSV3, overrides=TP2 + ["optimizer.comm_strategy=allgather_deredundency"])
    assert cfg.optimizer.type == "Muon" and cfg.plan().tensor_parallel == 2
    assert load_config(DSV3, overrides=TP2 + ["training.jit=layer"]).optimizer.qk_clip_enabled
    # the MTP depth runs through the tp runner (models/tp_model.py mtp_depth / mtp_head)
    assert dsv3_adamw(TP2 + ["model.num_nextn_predict_layers=1"]).plan().tensor_parallel == 2
    assert dsv3_adamw(TP2).plan().tensor_parallel == 2
    with pytest.raises(ConfigError, match=r"^model\.moe_shared_expert_intermediate_size: "
                                          r"moe_shared_expert_intermediate_size \(33\) must be a "
                                          r"multiple of tensor_model_parallel_size \(2\)"):
        dsv3_adamw(TP2 + ["model.moe_shared_expert_intermediate_size=33"])


def test_tp_x_ep_is_accepted_dropless_and_refused_with_a_capacity(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    ep2 = TP2 + ["parallelism.expert_parallel=2", "training.global_batch_size=8"]
    plan = load_config(DSV3, overrides=ep2).plan()
    # world 4 = tp 2 x dp 2; ep 2 folded over tp x dp: 2 ranks hold the same experts
    assert plan.tensor_parallel == 2 and plan.experts.expert_data_parallel == 2
    with pytest.raises(ConfigError, match=r"^parallelism\.expert_parallel: expert_parallel\(2\) "
                                          r"with parallelism\.tensor_parallel\(2\) runs dropless "
                                          r"only, but model\.moe_expert_capacity_factor is 1\.0"):
        load_config(DSV3, overrides=ep2 + ["model.moe_expert_capacity_factor=1.0"])


def test_whole_model_jit_and_recompute_under_tp_are_refused(world2):
    with pytest.raises(ConfigError, match=r"^training\.jit: model compiles the whole forward as "
                                          r"one graph, which cannot hold the tensor-parallel "
                                          r"collectives \(tensor_parallel 2\); use layer or none"):
        load_config(MARKOV, overrides=TP2 + ["training.jit=model"])
    with pytest.raises(ConfigError, match=r"^recompute\.mode: recompute is not implemented with "
                                          r"parallelism\.tensor_parallel > 1 \(2\)"):
        load_config(MARKOV, overrides=TP2 + ["recompute.mode=full", "training.jit=none"])
    assert load_config(MARKOV, overrides=TP2).model_jit_mode() == "layer"


def check(*sets):
    env = dict(os.environ, MS_ROLE="MS_WORKER", MS_WORKER_NUM="4")
    args = [a for kv in sets for a in ("--set", kv)]
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
                           MARKOV, "--mode", "1", "--check", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def test_check_prints_the_tp_plan_per_rank():
    r = check(*TP2)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data parallel    : 2" in r.stdout
    assert "tensor parallel  : 2 (sequence parallel)" in r.stdout
    assert "tp 2, pp 1, ep 1, cp 1, sp" in r.stdout
    held = [line for line in r.stdout.splitlines() if "parameters held" in line]
    assert len(held) == 1 and "tp 2)" in held[0]
    for item in ("parameters", "gradients", "optimizer state"):
        assert any(line.split()[:len(item.split())] == item.split()
                   for line in r.stdout.splitlines()), item


def test_check_exits_2_on_a_tp_rule():
    r = check("parallelism.tensor_parallel=2", "parallelism.sequence_parallel=false")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: parallelism.sequence_parallel: PyNative tensor parallelism requires "
        "sequence_parallel=True when tensor_parallel > 1, but got tensor_parallel=2."]


@pytest.mark.parametrize("which", ["gpt", "dsv3"])
def test_plan_counts_what_each_tp_rank_holds(world2, which):
    """The planner's per-rank parameters (and so its bytes) equal the real tp layout's."""
    import math
    from mindformers_core.core.memory_plan import plan_memory
    from mindformers_core.distributed.shard_spec import local_shape
    from mindformers_core.models.tp_plan import AttentionShape, tp_shard_specs
    from mindformers_core.models import build_model
    cfg = load_config(MARKOV, overrides=TP2) if which == "gpt" else dsv3_adamw(TP2)
    model = build_model(cfg.model, seed=0, jit="none")
    m = cfg.model
    specs = tp_shard_specs([(p.name, p.shape) for p in model.get_parameters()], 2,
                           AttentionShape(m.num_attention_heads, m.resolved_num_query_groups(),
                                          m.hidden_size // m.num_attention_heads))
    held = sum(math.prod(local_shape(specs[p.name]) if p.name in specs else p.shape)
               for p in model.get_parameters() if p.requires_grad)
    plan = plan_memory(cfg, 2)
    assert plan.params_per_rank == held
    assert plan.items["parameters"] == 4 * held and plan.items["gradients"] == 4 * held
    assert plan.layout.tp == 2 and plan.layout.sequence_parallel
