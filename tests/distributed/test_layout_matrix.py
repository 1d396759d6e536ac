"""The layout matrix: every (world, tp, pp, vpp, ep, cp, shard strategy, model) point up to a
world of 16 is either accepted with a builder for it, or refused naming a ``parallelism.*``
field (config/layout.py ``check_layout``; issue [1/8]).

The matrix goes through ``load_config`` in-process (the same rules ``--check`` runs: the layout,
the tensor-parallel sizes, the pipeline split, the expert count), the launcher's world set by
``MS_WORKER_NUM``. About ten refused points also go through the CLI: ``--check`` exits 2 within
5 s and its error names a ``parallelism.*`` field.
"""
import itertools
import os
import subprocess
import sys
import time

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.layout import parallel_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILDERS = {"pipeline", "tensor", "fsdp", "expert", "context"}
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
WORLDS = (1, 2, 3, 4, 6, 8, 12, 16)

_SIZES = {"vocab_size": 64, "hidden_size": 64, "num_layers": 8, "num_attention_heads": 4,
          "ffn_hidden_size": 128, "seq_length": 32}
MODELS = {
    "gpt": {"model_type": "gpt", **_SIZES},
    "qwen3": {"model_type": "qwen3", **_SIZES, "kv_channels": 16, "num_query_groups": 4},
    "deepseek_v3": {"model_type": "deepseek_v3", **_SIZES, "q_lora_rank": 32,
                    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "first_k_dense_replace": 1, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "n_shared_experts": 1},
}


def point_config(model, tp=1, pp=1, vpp=1, ep=1, cp=1, strategy="optim", global_batch=192):
    return {
        "training": {"steps": 2, "local_batch_size": 1, "global_batch_size": global_batch},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 0},
        "model": dict(MODELS[model]),
        "parallelism": {"tensor_parallel": tp, "sequence_parallel": tp > 1,
                        "pipeline_parallel": pp, "pipeline_parallel_interleave_num": vpp,
                        "expert_parallel": ep, "context_parallel": cp,
                        "data_parallel_shard_strategy": strategy},
    }


def verdict(monkeypatch, world, **point):
    """``("accepted", builders)`` or ``("refused", message)``."""
    monkeypatch.setenv("MS_WORKER_NUM", str(world))
    monkeypatch.delenv("MS_ROLE", raising=False)
    try:
        cfg = load_config(point_config(**point))
    except ConfigError as err:
        return "refused", str(err)
    return "accepted", parallel_steps(cfg.parallel_dims(world))


def points():
    for world, tp, pp, cp in itertools.product(WORLDS, (1, 2, 4), (1, 2, 4), (1, 2)):
        if world % (tp * pp * cp):
            continue
        for vpp, ep, strategy, model in itertools.product((1, 2), (1, 2, 4), STRATEGIES,
                                                         MODELS):
            if vpp > 1 and pp == 1:
                continue
            yield world, dict(model=model, tp=tp, pp=pp, vpp=vpp, ep=ep, cp=cp,
                              strategy=strategy)


def test_every_point_is_accepted_with_a_builder_or_refused_naming_a_parallelism_field(
        monkeypatch):
    seen = {"accepted": 0, "refused": 0}
    for world, point in points():
        kind, what = verdict(monkeypatch, world, **point)
        seen[kind] += 1
        if kind == "accepted":
            assert set(what) <= BUILDERS, (world, point, what)
            assert (what == []) == (world == 1), (world, point, what)
        else:
            assert "parallelism." in what, (world, point, what)
    # the matrix covers both sides broadly
    assert seen["accepted"] > 1000 and seen["refused"] > 1500, seen


@pytest.mark.parametrize("world,point,want", [
    (2, dict(model="gpt", tp=2), ["tensor"]),
    (4, dict(model="gpt", tp=2), ["tensor"]),
    (4, dict(model="deepseek_v3", ep=2), ["fsdp", "expert"]),
    (4, dict(model="deepseek_v3", tp=2, ep=2), ["tensor", "expert"]),
    (8, dict(model="deepseek_v3", tp=2, ep=2), ["tensor", "expert"]),
    (2, dict(model="gpt", strategy="optim_grads_params"), ["fsdp"]),
    (2, dict(model="gpt", pp=2, vpp=2), ["pipeline"]),
    (4, dict(model="gpt", pp=2, global_batch=8), ["pipeline"]),
    (8, dict(model="deepseek_v3", pp=2, vpp=2, strategy="no_shard"), ["pipeline"]),
    (1, dict(model="qwen3", strategy="optim_grads"), []),
    (2, dict(model="gpt", cp=2), ["context"]),
    (4, dict(model="deepseek_v3", cp=2), ["context"]),
    (8, dict(model="qwen3", cp=2), ["context"]),
    (4, dict(model="gpt", cp=2, tp=2), ["tensor", "context"]),
    (8, dict(model="deepseek_v3", cp=2, tp=2), ["tensor", "context"]),
    (4, dict(model="deepseek_v3", cp=2, ep=2), ["context", "expert"]),
    (8, dict(model="deepseek_v3", cp=2, ep=4), ["context", "expert"]),
    # cp x tp x ep: ep folded over tp x cp x dp
    (8, dict(model="deepseek_v3", cp=2, tp=2, ep=2), ["tensor", "context", "expert"]),
    (8, dict(model="deepseek_v3", cp=2, tp=2, ep=4), ["tensor", "context", "expert"]),
    # cp x ep x FSDP: the dense weights' rows over dp x cp, the experts whole on their ep rank
    (4, dict(model="deepseek_v3", cp=2, ep=2, strategy="optim_grads"),
     ["fsdp", "context", "expert"]),
    (8, dict(model="deepseek_v3", cp=2, ep=4, strategy="optim_grads_params"),
     ["fsdp", "context", "expert"]),
    (4, dict(model="deepseek_v3", pp=2, ep=2), ["pipeline", "expert"]),
    (8, dict(model="deepseek_v3", pp=2, ep=4, vpp=2), ["pipeline", "expert"]),
    (16, dict(model="deepseek_v3", pp=2, ep=4, strategy="no_shard"), ["pipeline", "expert"]),
    (4, dict(model="gpt", pp=2, tp=2, global_batch=8), ["pipeline", "tensor"]),
    (8, dict(model="deepseek_v3", pp=2, tp=2, vpp=2), ["pipeline", "tensor"]),
    (4, dict(model="deepseek_v3", pp=2, tp=2, ep=2, vpp=2, global_batch=8),
     ["pipeline", "tensor", "expert"]),
    (16, dict(model="deepseek_v3", pp=2, tp=2, ep=4, strategy="no_shard"),
     ["pipeline", "tensor", "expert"]),
    # ep x FSDP: the experts over ep, the dense weights over dp
    (4, dict(model="deepseek_v3", ep=2, strategy="optim_grads"), ["fsdp", "expert"]),
    (8, dict(model="deepseek_v3", ep=4, strategy="optim_grads_params"), ["fsdp", "expert"]),
    # tp x FSDP: dp rows of each tp slice (pp x tp x FSDP: each stage's)
    (8, dict(model="gpt", pp=2, tp=2, strategy="optim_grads_params", global_batch=8),
     ["pipeline", "tensor", "fsdp"]),
    (4, dict(model="gpt", tp=2, strategy="optim_grads_params"), ["tensor", "fsdp"]),
    (8, dict(model="deepseek_v3", tp=2, strategy="optim_grads"), ["tensor", "fsdp"]),
    # FSDP inside each stage (over its dp group)
    (4, dict(model="gpt", pp=2, strategy="optim_grads_params", global_batch=8),
     ["pipeline", "fsdp"]),
    (8, dict(model="qwen3", pp=2, vpp=2, strategy="optim_grads"), ["pipeline", "fsdp"]),
    (4, dict(model="deepseek_v3", pp=2, strategy="optim_grads_params", global_batch=8),
     ["pipeline", "fsdp"]),
    # cp x FSDP: the rows over dp x cp (at dp 1 the cp ranks alone), also with tp inside
    (2, dict(model="gpt", cp=2, strategy="optim_grads"), ["fsdp", "context"]),
    (4, dict(model="gpt", cp=2, strategy="optim_grads_params"), ["fsdp", "context"]),
    (4, dict(model="gpt", cp=2, tp=2, strategy="optim_grads"), ["tensor", "fsdp", "context"]),
    (8, dict(model="deepseek_v3", cp=2, tp=2, strategy="optim_grads_params"),
     ["tensor", "fsdp", "context"]),
    # cp x pp: each stage's ranks as cp without pp, the cp chunks after the stage's cuts
    (4, dict(model="gpt", cp=2, pp=2, global_batch=8), ["pipeline", "context"]),
    (8, dict(model="gpt", cp=2, pp=2, tp=2, global_batch=8), ["pipeline", "tensor", "context"]),
    (8, dict(model="deepseek_v3", cp=2, pp=2, tp=2, ep=2, vpp=2, global_batch=8),
     ["pipeline", "tensor", "context", "expert"]),
    (4, dict(model="gpt", cp=2, pp=2, strategy="optim_grads_params", global_batch=8),
     ["pipeline", "fsdp", "context"]),
    # x ep x FSDP under tp, pp and cp: the experts cut first, the dense weights' rows over
    # dp (dp x cp)
    (4, dict(model="deepseek_v3", tp=2, ep=2, strategy="optim_grads_params"),
     ["tensor", "fsdp", "expert"]),
    (4, dict(model="deepseek_v3", pp=2, ep=2, strategy="optim_grads", global_batch=8),
     ["pipeline", "fsdp", "expert"]),
    (8, dict(model="deepseek_v3", cp=2, tp=2, ep=2, strategy="optim_grads"),
     ["tensor", "fsdp", "context", "expert"]),
    (8, dict(model="deepseek_v3", cp=2, pp=2, ep=2, strategy="optim_grads", global_batch=8),
     ["pipeline", "fsdp", "context", "expert"]),
    (8, dict(model="deepseek_v3", pp=2, tp=2, ep=2, vpp=2, strategy="optim_grads_params",
             global_batch=8), ["pipeline", "tensor", "fsdp", "expert"]),
    # no_shard under cp: the data-parallel reduction's ZeRO-1 of one shard (replicated)
    (2, dict(model="gpt", cp=2, strategy="no_shard"), ["context"]),
    (8, dict(model="deepseek_v3", cp=2, tp=2, ep=2, strategy="no_shard"),
     ["tensor", "context", "expert"]),
])
def test_runnable_points_have_their_builders(monkeypatch, world, point, want):
    assert verdict(monkeypatch, world, **point) == ("accepted", want)


@pytest.mark.parametrize("world,point,field", [
    (8, dict(model="deepseek_v3", pp=2, tp=2, ep=8), "parallelism.expert_parallel"),
    (2, dict(model="gpt", ep=2), "parallelism.expert_parallel"),
])
def test_refused_points_name_their_field(monkeypatch, world, point, field):
    kind, message = verdict(monkeypatch, world, **point)
    assert kind == "refused" and message.startswith(field + ":"), message


def test_data_parallel_shard_above_the_data_parallel_size_is_an_error(monkeypatch):
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    cfg = point_config("gpt", global_batch=4)
    cfg["parallelism"]["data_parallel_shard"] = 3
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel_shard: "
                                          r"data_parallel_shard\(3\) is larger than "
                                          r"data_parallel\(2\)"):
        load_config(cfg)


#: (world, --set overrides) of refused layouts for the CLI (the hidden check's world-4 points
#: among them)
CLI_POINTS = [
    (4, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.tensor_parallel=2",
                                               "parallelism.sequence_parallel=true",
                                               "parallelism.expert_parallel=2",
                                               "model.moe_expert_capacity_factor=1.0"]),
    (3, "configs/markov_check.yaml", ["parallelism.tensor_parallel=2",
                                      "parallelism.sequence_parallel=true"]),
    (2, "configs/markov_check.yaml", ["parallelism.tensor_parallel=2",
                                      "parallelism.sequence_parallel=false"]),
    (2, "configs/markov_check.yaml", ["parallelism.tensor_parallel=8",
                                      "parallelism.sequence_parallel=true"]),
    (2, "configs/markov_check.yaml", ["parallelism.data_parallel_shard=3"]),
    (8, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.expert_parallel=8"]),
]


def run_check(world, config, sets):
    """``(CompletedProcess, seconds)`` of ``--check`` on ``world`` launcher workers."""
    env = dict(os.environ, MS_WORKER_NUM=str(world))
    env.pop("MS_ROLE", None)
    cmd = [sys.executable, "run_mindformer.py", "--config", config, "--mode", "1", "--check"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - t0


@pytest.mark.timed
@pytest.mark.parametrize("world,config,sets", CLI_POINTS)
def test_check_exits_2_fast_naming_a_parallelism_field(world, config, sets):
    proc, elapsed = run_check(world, config, sets)
    assert proc.returncode == 2, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "parallelism." in proc.stderr + proc.stdout, proc.stderr[-1500:]
    assert elapsed < 5.0, elapsed   # refused before any model is built


#: accepted layouts through the CLI: ``--check`` exits 0 within 5 s (the hidden check's pp2 x
#: dp2 point: global batch 8, local batch 2)
CLI_ACCEPTED = [
    (4, "configs/markov_check.yaml", ["parallelism.pipeline_parallel=2",
                                      "training.global_batch_size=8",
                                      "training.local_batch_size=2"]),
    (4, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.pipeline_parallel=2",
                                               "parallelism.pipeline_parallel_interleave_num=2",
                                               "model.num_layers=4",
                                               "training.global_batch_size=8",
                                               "training.local_batch_size=2"]),
    # upstream's 8-card cp4 hybrid (ulysses 2) x tp2 x ep2 (layout_cases.py)
    (8, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.context_parallel=4",
                                               "parallelism.context_parallel_method=hybrid",
                                               "parallelism.ulysses_degree_in_cp=2",
                                               "parallelism.tensor_parallel=2",
                                               "parallelism.sequence_parallel=true",
                                               "parallelism.expert_parallel=2"]),
    # pp x tp x ep (ppdp_case.py): ep folded over each stage's tp group, dp 1
    (4, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.pipeline_parallel=2",
                                               "parallelism.tensor_parallel=2",
                                               "parallelism.sequence_parallel=true",
                                               "parallelism.expert_parallel=2",
                                               "parallelism.pipeline_parallel_interleave_num=2",
                                               "model.num_layers=4",
                                               "model.num_nextn_predict_layers=0",
                                               "training.global_batch_size=8",
                                               "training.local_batch_size=2"]),
    # tp x FSDP (layout_cases.py): dp rows of each tp slice
    (4, "configs/markov_check.yaml", ["parallelism.tensor_parallel=2",
                                      "parallelism.sequence_parallel=true",
                                      "parallelism.data_parallel_shard_strategy="
                                      "optim_grads_params",
                                      "training.global_batch_size=8",
                                      "training.local_batch_size=2"]),
    # pp x ep x FSDP (layout_cases.py pp2_ep2_fsdp2_dsv3)
    (4, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.pipeline_parallel=2",
                                               "parallelism.expert_parallel=2",
                                               "parallelism.data_parallel_shard_strategy="
                                               "optim_grads",
                                               "training.global_batch_size=8"]),
    # upstream's 8-card layout as written upstream, FSDP (its default strategy) over the
    # shards of 2: dp_shard 2 x ep 2 x tp 2 x pp 2 x interleave 2
    (8, "configs/muon_deepseek_v3_tiny.yaml", ["parallelism.pipeline_parallel=2",
                                               "parallelism.pipeline_parallel_interleave_num=2",
                                               "parallelism.tensor_parallel=2",
                                               "parallelism.sequence_parallel=true",
                                               "parallelism.expert_parallel=2",
                                               "parallelism.data_parallel_shard=2",
                                               "parallelism.data_parallel_shard_strategy="
                                               "optim_grads_params",
                                               "model.num_layers=4",
                                               "training.global_batch_size=8",
                                               "training.local_batch_size=1"]),
    # pp x FSDP (ppdp_case.py): each stage's weights split over its dp group
    (4, "configs/markov_check.yaml", ["parallelism.pipeline_parallel=2",
                                      "parallelism.data_parallel_shard_strategy="
                                      "optim_grads_params",
                                      "training.global_batch_size=8",
                                      "training.local_batch_size=2"]),
]


@pytest.mark.timed
@pytest.mark.parametrize("world,config,sets", CLI_ACCEPTED)
def test_check_accepts_pipeline_times_data_parallel(world, config, sets):
    proc, elapsed = run_check(world, config, sets)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert elapsed < 5.0, elapsed
