"""``parallelism.expert_parallel``: its rules (core/expert_rules.py, config/expert_layout.py)
with upstream's message, the ``--check`` exit code, and the plan's per-rank expert layout."""
import os
import subprocess
import sys

import pytest

from mindformers_core.config import load_config
from mindformers_core.errors import ConfigError
from mindformers_core.core.expert_rules import (EXPERTS_MESSAGE, check_expert_count,
                                                check_expert_dp, experts_per_rank)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    monkeypatch.delenv("MS_ROLE", raising=False)


def cfg_with(*overrides):
    return load_config(TINY, overrides=list(overrides))


def test_upstream_message_names_both_fields():
    with pytest.raises(ValueError) as exc:
        check_expert_count(4, 3)
    assert str(exc.value) == (f"{EXPERTS_MESSAGE} model.n_routed_experts(4) is not divisible "
                              f"by parallelism.expert_parallel(3).")
    assert EXPERTS_MESSAGE == "Number of experts should be a multiple of expert model " \
                              "parallel_size."


def test_expert_count_rules():
    check_expert_count(4, 1)
    check_expert_count(None, 1)        # a dense model takes expert_parallel 1
    check_expert_count(256, 8)
    assert experts_per_rank(256, 8) == 32
    with pytest.raises(ValueError, match=r"^expert_parallel must be a positive integer, but "
                                         r"got 0\.$"):
        check_expert_count(4, 0)
    with pytest.raises(ValueError, match=r"^expert_parallel\(2\) splits the routed experts over "
                                         r"ranks, but the model has none"):
        check_expert_count(None, 2)


def test_dp_rule_is_the_mesh_message():
    from mindformers_core.core.parallel_dims import make_mesh
    check_expert_dp(4, 2)
    with pytest.raises(ValueError, match=r"^data_parallel\(2\) must be divisible by "
                                         r"expert_parallel\(4\)\.$"):
        check_expert_dp(2, 4)
    with pytest.raises(ValueError, match=r"^data_parallel\(2\) must be divisible by "
                                         r"expert_parallel\(4\)\.$"):
        make_mesh(2, ep=4)


def test_config_error_for_experts_is_checked_on_any_world():
    with pytest.raises(ConfigError) as exc:
        cfg_with("parallelism.expert_parallel=3")
    assert str(exc.value).startswith("parallelism.expert_parallel: Number of experts should be "
                                     "a multiple of expert model parallel_size.")
    assert "model.n_routed_experts(4)" in str(exc.value)


def test_experts_fold_over_the_tensor_parallel_ranks_of_a_stage(monkeypatch):
    """With tp (or cp) ep divides the ranks of a stage, not dp: tp2 x ep2 on 2 ranks (dp 1)
    is accepted at config load, ep4 there is refused naming the field."""
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    tp = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=True",
          "training.local_batch_size=2", "training.global_batch_size=2"]
    assert cfg_with("parallelism.expert_parallel=2", *tp).plan(2).experts.experts_per_rank == 2
    with pytest.raises(ConfigError, match=r"^parallelism\.expert_parallel: expert_parallel\(4\) "
                                          r"must divide tensor_parallel\(2\) \* "
                                          r"context_parallel\(1\) \* data_parallel\(1\) = 2: "
                                          r"the routed experts are folded over the ranks of a "
                                          r"pipeline stage\.$"):
        cfg_with("parallelism.expert_parallel=4", *tp)


def test_config_errors_for_dp_and_for_a_dense_model(monkeypatch):
    # one process: dp 1 cannot hold 2 EP ranks (the launcher's world decides dp)
    with pytest.raises(ConfigError, match=r"^parallelism\.expert_parallel: data_parallel\(1\) "
                                          r"must be divisible by expert_parallel\(2\)\.$"):
        cfg_with("parallelism.expert_parallel=2")
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    cfg = cfg_with("parallelism.expert_parallel=2", "training.local_batch_size=2",
                   "training.global_batch_size=4")
    assert cfg.plan(2).experts.experts_per_rank == 2
    with pytest.raises(ConfigError, match=r"^parallelism\.expert_parallel: data_parallel\(2\) "
                                          r"must be divisible by expert_parallel\(4\)\.$"):
        cfg.parallelism.expert_parallel = 4
        cfg.plan(2)
    with pytest.raises(ConfigError, match=r"^parallelism\.expert_parallel: expert_parallel\(2\) "
                                          r"splits the routed experts over ranks, but the model "
                                          r"has none"):
        load_config(os.path.join(ROOT, "configs", "markov_check.yaml"),
                    overrides=["parallelism.expert_parallel=2", "training.local_batch_size=2",
                               "training.global_batch_size=4"])


def test_plan_shows_experts_per_rank_and_bytes(monkeypatch):
    single = cfg_with().plan(1).experts
    assert (single.experts_per_rank, single.expert_params_per_rank) == (4, 4 * 3 * 64 * 64)
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    cfg = cfg_with("parallelism.expert_parallel=2", "training.local_batch_size=2",
                   "training.global_batch_size=8")
    plan = cfg.plan(4)
    e = plan.experts
    # 1 MoE layer (2 layers, first_k_dense_replace 1), H 64, F 64: 3 H F params per expert
    assert (e.expert_parallel, e.expert_data_parallel, e.num_experts, e.experts_per_rank,
            e.moe_layers) == (2, 2, 4, 2, 1)
    assert e.expert_params_per_rank == 2 * 3 * 64 * 64
    assert e.expert_bytes_per_rank == 4 * 2 * 3 * 64 * 64          # float32
    assert ("expert parallel  : 2 (edp 2); 2 of 4 experts per rank in each of 1 MoE layers: "
            "24576 expert params, 98304 bytes per rank") in plan.format()
    assert plan.to_dict()["experts"]["experts_per_rank"] == 2


def test_plan_under_pp_x_ep_says_a_rank_holds_its_stages_layers(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    cfg = cfg_with("parallelism.expert_parallel=2", "parallelism.pipeline_parallel=2",
                   "training.local_batch_size=2", "training.global_batch_size=8")
    text = cfg.plan(4).format()
    assert ("2 of 4 experts per rank in each of 1 MoE layers: 24576 expert params, 98304 bytes "
            "per rank if it held every stage's layers (pp 2: a rank holds its stage's MoE "
            "layers)") in text
    assert "parallel layout  : world 4 = tp 1 x cp 1 x dp 2" in text and "pp 2" in text


def test_check_cli_exit_2_names_both_fields():
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MS_WORKER_NUM")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
                        TINY, "--mode", "1", "--check", "--set", "parallelism.expert_parallel=3"],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "parallelism.expert_parallel" in r.stderr and "model.n_routed_experts(4)" in r.stderr
    assert "Number of experts should be a multiple of expert model parallel_size." in r.stderr
    assert "Traceback" not in r.stderr
