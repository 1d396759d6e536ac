"""`parallelism.context_parallel > 1`: the cp fields and their rules against the model
(config/context_parallel_rules.py), each refusal a ConfigError naming the field, and
``--check`` exiting 2 within 5 s on each; what is accepted and its plan."""
import os
import subprocess
import sys
import time

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.layout import parallel_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKOV = os.path.join(ROOT, "configs", "markov_check.yaml")
DSV3 = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
CP2 = ["parallelism.context_parallel=2"]


@pytest.fixture
def world(monkeypatch):
    def set_world(n):
        monkeypatch.setenv("MS_WORKER_NUM", str(n))
        monkeypatch.delenv("MS_ROLE", raising=False)
    return set_world


@pytest.mark.parametrize("n,config,sets", [
    (2, MARKOV, CP2),
    (2, MARKOV, CP2 + ["parallelism.context_parallel_method=ulysses"]),
    (4, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                 "parallelism.ulysses_degree_in_cp=2"]),
    (4, DSV3, CP2 + ["parallelism.context_parallel_method=ulysses"]),
    (2, DSV3, CP2 + ["parallelism.context_parallel_async=True"]),
    # recompute reruns the cp core in the backward (config/context_parallel_rules.py)
    (2, MARKOV, CP2 + ["recompute.mode=full"]),
    (2, DSV3, CP2 + ["parallelism.context_parallel_method=ulysses", "recompute.mode=select",
                     "recompute.select_module={'layers.*.self_attention.core_attention': [0]}"]),
])
def test_cp_layouts_are_accepted_with_the_context_builder(world, n, config, sets):
    world(n)
    cfg = load_config(config, overrides=sets)
    dims = cfg.parallel_dims()
    assert dims.cp == int(sets[0].split("=")[1]) and dims.dp == n // dims.cp
    assert parallel_steps(dims) == ["context"]
    assert cfg.model_jit_mode() == "none"   # an unwritten training.jit is none under cp


TP2 = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"]


@pytest.mark.parametrize("n,config,sets,want", [
    (4, MARKOV, CP2 + TP2, ["tensor", "context"]),
    (4, MARKOV, CP2 + TP2 + ["parallelism.context_parallel_method=ulysses"],
     ["tensor", "context"]),
    (4, DSV3, CP2 + TP2, ["tensor", "context"]),
    (4, DSV3, CP2 + ["parallelism.expert_parallel=2"], ["context", "expert"]),
    # cp x tp x ep: ep folded over tp x cp x dp (ep4 at world 4: the tp x cp ranks; upstream's
    # 8-card cp2 ulysses x tp2 x ep2 and cp4 hybrid x tp2 x ep2)
    (4, DSV3, CP2 + TP2 + ["parallelism.expert_parallel=4"], ["tensor", "context", "expert"]),
    (8, DSV3, CP2 + TP2 + ["parallelism.expert_parallel=2",
                           "parallelism.context_parallel_method=ulysses"],
     ["tensor", "context", "expert"]),
    (8, DSV3, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
               "parallelism.ulysses_degree_in_cp=2", "parallelism.expert_parallel=2"] + TP2,
     ["tensor", "context", "expert"]),
    # cp x FSDP: the rows over dp x cp (world 2: the two cp ranks)
    (2, MARKOV, CP2 + ["parallelism.data_parallel_shard_strategy=optim_grads"],
     ["fsdp", "context"]),
    (4, DSV3, CP2 + ["parallelism.data_parallel_shard_strategy=optim_grads_params"],
     ["fsdp", "context"]),
    (4, MARKOV, CP2 + TP2 + ["parallelism.data_parallel_shard_strategy=optim_grads_params"],
     ["tensor", "fsdp", "context"]),
    # cp x ep x FSDP: the dense weights' rows over dp x cp, the experts on their ep rank
    (4, DSV3, CP2 + ["parallelism.expert_parallel=2",
                     "parallelism.data_parallel_shard_strategy=optim_grads"],
     ["fsdp", "context", "expert"]),
])
def test_cp_times_tp_and_cp_times_ep_are_accepted(world, n, config, sets, want):
    world(n)
    dims = load_config(config, overrides=sets).parallel_dims()
    assert parallel_steps(dims) == want and dims.cp > 1


#: (world, config, overrides, the field the error starts with, a part of its text)
REFUSED = [
    (2, MARKOV, CP2 + ["model.seq_length=30"], "model.seq_length",
     r"seq_length\(30\) must be divisible by 2 \* context_parallel = 4"),
    (4, MARKOV, ["parallelism.context_parallel=4", "model.seq_length=20"], "model.seq_length",
     r"divisible by 2 \* context_parallel = 8"),
    (2, MARKOV, CP2 + ["parallelism.context_parallel_method=ulysses",
                       "model.num_attention_heads=3", "model.hidden_size=48"],
     "model.num_attention_heads", r"num_attention_heads\(3\) must be divisible by the ulysses "
                                  r"degree 2"),
    (2, MARKOV, CP2 + ["parallelism.context_parallel_method=ulysses",
                       "model.num_query_groups=1"],
     "model.num_query_groups", r"num_query_groups\(1\) must be divisible by the ulysses degree"),
    (4, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                 "parallelism.ulysses_degree_in_cp=4", "model.num_attention_heads=2",
                 "model.hidden_size=64"],
     "model.num_attention_heads", r"ulysses degree 4"),
    (4, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                 "parallelism.ulysses_degree_in_cp=3"],
     "parallelism.ulysses_degree_in_cp", r"ulysses_degree_in_cp\(3\) must be >= 1 and divide "
                                         r"parallelism\.context_parallel\(4\)"),
    (2, MARKOV, CP2 + ["parallelism.ulysses_degree_in_cp=2"],
     "parallelism.ulysses_degree_in_cp", r"is set \(2\) while "
                                         r"parallelism\.context_parallel_method is 'colossal'"),
    (4, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=ulysses",
                 "parallelism.ulysses_degree_in_cp=2"],
     "parallelism.ulysses_degree_in_cp", r"must equal parallelism\.context_parallel\(4\) with "
                                         r"context_parallel_method 'ulysses'"),
    (4, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid"],
     "parallelism.ulysses_degree_in_cp", r"'hybrid' needs ulysses_degree_in_cp"),
    (2, MARKOV, CP2 + ["parallelism.context_parallel_mask_type=full"],
     "parallelism.context_parallel_mask_type", r"must be 'causal', got 'full'"),
    (2, MARKOV, CP2 + ["parallelism.context_parallel_method=ring"],
     "parallelism.context_parallel_method", r"must be one of \['colossal', 'ulysses', "
                                            r"'hybrid'\]"),
    (2, MARKOV, CP2 + ["training.jit=layer"], "training.jit", r"must be none with context "
                                                              r"parallelism"),
    # recompute runs under cp (accepted above), the tensor-parallel rule still holds under tp
    (4, MARKOV, CP2 + TP2 + ["recompute.mode=full"], "recompute.mode",
     r"recompute is not implemented with parallelism.tensor_parallel > 1 \(2\)"),
    # under cp x tp the all-to-all splits a tp rank's 4 / 2 = 2 local heads
    (8, MARKOV, ["parallelism.context_parallel=4", "parallelism.context_parallel_method=ulysses",
                 "parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"],
     "model.num_attention_heads", r"num_attention_heads\(4\) / tensor_parallel\(2\) = 2 must "
                                  r"be divisible by the ulysses degree 4"),
    # dropless only under cp (each cp rank routes its chunks' tokens)
    (2, DSV3, CP2 + ["model.moe_expert_capacity_factor=1.0"], "model.moe_expert_capacity_factor",
     r"is 1.0, but context parallel runs dropless only: each cp rank routes its chunks' "
     r"tokens"),
]


@pytest.mark.parametrize("n,config,sets,field,text", REFUSED)
def test_bad_cp_input_is_refused_naming_the_field(world, n, config, sets, field, text):
    world(n)
    with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ": .*" + text):
        load_config(config, overrides=sets)


def check(n, config, sets):
    """``(exit status, stdout + stderr, seconds)`` of ``--check`` on a world of ``n``."""
    env = {k: v for k, v in os.environ.items() if k != "MS_ROLE"}
    env["MS_WORKER_NUM"] = str(n)
    args = [a for s in sets for a in ("--set", s)]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "run_mindformer.py", "--config", config, "--mode", "1",
                           "--check", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


@pytest.mark.parametrize("n,config,sets,field,text",
                         [REFUSED[i] for i in (0, 2, 5, 6, 9)])
@pytest.mark.timed
def test_check_exits_2_fast_naming_the_field(n, config, sets, field, text):
    rc, out, elapsed = check(n, config, sets)
    assert rc == 2 and f"error: {field}: " in out, out[-1500:]
    assert elapsed < 5.0, elapsed


@pytest.mark.timed
def test_check_accepts_cp_times_tp_and_seq_length_30_still_exits_2():
    rc, out, _ = check(4, MARKOV, CP2 + TP2)
    assert rc == 0, out[-1500:]
    rc, out, elapsed = check(4, MARKOV, CP2 + TP2 + ["model.seq_length=30"])
    assert rc == 2 and "error: model.seq_length: seq_length(30)" in out, out[-1500:]
    assert elapsed < 5.0, elapsed


def test_context_parallel_async_is_accepted_with_a_check_note():
    rc, out, _ = check(2, MARKOV, CP2 + ["parallelism.context_parallel_async=True"])
    assert rc == 0, out[-1500:]
    assert "parallelism.context_parallel_async: True changes nothing here" in out


def test_the_memory_plan_line_prints_the_per_rank_sequence_length(world):
    from mindformers_core.core.memory_plan import Layout, estimate_memory
    from mindformers_core.core.memory_verdict import format_memory_plan
    world(4)
    cfg = load_config(MARKOV, overrides=["parallelism.context_parallel=4",
                                         "model.seq_length=64"])
    plan = estimate_memory(cfg, Layout.from_dims(cfg.parallel_dims()))
    assert plan.seq_per_rank == 16
    assert "sequence 16 per rank (seq_length 64 / cp 4)" in format_memory_plan(plan).splitlines()[0]
    one = estimate_memory(cfg, Layout())
    assert one.seq_per_rank == 64 and "per rank (seq_length" not in format_memory_plan(one)
    # the activations fall with the sequence held (the planner's own items)
    assert plan.items["activations"] < 0.35 * one.items["activations"]
