"""Fully sharded data parallel: the strategy rules (config/shard_strategy.py), which parameters
are split (distributed/fsdp_layout.py), and the refusals of ``apply_fsdp`` and
``ZeroSharding`` -- one process (the 2-worker runs: test_fsdp_msrun.py)."""
import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.errors import ConfigError
from mindformers_core.config.parallelism import ParallelismConfig
from mindformers_core.config.shard_strategy import (check_shard_strategy, optimizer_shard_count,
                                                    shards_grads, shards_params)
from mindformers_core.distributed.fsdp_layout import fsdp_specs
from mindformers_core.distributed.shard_spec import ShardSpec, shard, unshard


def workers(monkeypatch, n):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", str(n))


def test_what_each_strategy_shards():
    assert [shards_grads(s) for s in ("no_shard", "optim", "optim_grads",
                                      "optim_grads_params")] == [False, False, True, True]
    assert [shards_params(s) for s in ("optim", "optim_grads", "optim_grads_params")] == \
        [False, False, True]
    assert optimizer_shard_count("no_shard", 4) == 1
    assert optimizer_shard_count("optim_grads", 4) == 4


def test_bad_strategy_value_names_the_field(monkeypatch):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel_shard_strategy: must be "
                                          r"one of \['no_shard', 'optim', 'optim_grads', "
                                          r"'optim_grads_params'\], got 'zero3'"):
        ParallelismConfig.from_dict({"data_parallel_shard_strategy": "zero3"}, "parallelism")
    with pytest.raises(ValueError, match=r"must be one of .*got 'full'"):
        check_shard_strategy("full", 2, 2)


@pytest.mark.parametrize("strategy", ["optim_grads", "optim_grads_params"])
def test_hsdp_of_gradients_or_parameters_is_refused(monkeypatch, strategy):
    workers(monkeypatch, 4)
    with pytest.raises(ConfigError, match=rf"^parallelism\.data_parallel_shard_strategy: "
                                          rf"'{strategy}' shards over all data-parallel ranks "
                                          rf"here, but data_parallel_shard gives 2 of "
                                          rf"data_parallel\(4\) \(HSDP"):
        ParallelismConfig.from_dict({"data_parallel_shard": 2,
                                     "data_parallel_shard_strategy": strategy}, "parallelism")
    # ZeRO-1 HSDP, and sharding over all ranks, stay accepted
    ParallelismConfig.from_dict({"data_parallel_shard": 2}, "parallelism")
    ParallelismConfig.from_dict({"data_parallel_shard": 4,
                                 "data_parallel_shard_strategy": strategy}, "parallelism")


def test_reshard_never_is_refused_with_sharded_parameters(monkeypatch):
    workers(monkeypatch, 2)
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel_shard_strategy: "
                                          r"'optim_grads_params' with "
                                          r"reshard_after_forward_policy 'never' keeps the "
                                          r"gathered parameters"):
        ParallelismConfig.from_dict({"data_parallel_shard_strategy": "optim_grads_params",
                                     "reshard_after_forward_policy": "never"}, "parallelism")
    for policy in ("default", "always"):
        ParallelismConfig.from_dict({"data_parallel_shard_strategy": "optim_grads_params",
                                     "reshard_after_forward_policy": policy}, "parallelism")
    ParallelismConfig.from_dict({"data_parallel_shard_strategy": "optim_grads",
                                 "reshard_after_forward_policy": "never"}, "parallelism")


def test_disable_gradient_division_must_be_a_bool(monkeypatch):
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    with pytest.raises(ConfigError, match=r"^parallelism\.disable_gradient_division: "):
        ParallelismConfig.from_dict({"disable_gradient_division": "yes"}, "parallelism")


def test_fsdp_splits_dim0_multiples_of_the_shard_count():
    specs = fsdp_specs([("w", (6, 4)), ("b", (6,)), ("odd", (5, 4)), ("s", ())], 2)
    assert specs == {"w": ShardSpec((6, 4), 0, "dp", 2), "b": ShardSpec((6,), 0, "dp", 2)}
    assert fsdp_specs([("w", (6, 4))], 1) == {}
    # the shards are the ZeRO-1 rows of the same parameter, and merge back
    from mindformers_core.distributed.shard_layout import shard_rows
    full = np.arange(24, dtype=np.float32).reshape(6, 4)
    parts = [shard(specs["w"], full, k) for k in range(2)]
    for k in range(2):
        start, stop = shard_rows(6, 2, k)
        np.testing.assert_array_equal(parts[k], full[start:stop])
    np.testing.assert_array_equal(unshard(specs["w"], parts), full)


def test_sharded_parameters_need_sharded_gradients_and_full_state_sharding():
    from mindformers_core.distributed.comm import Communicator
    from mindformers_core.distributed.zero import ZeroSharding
    with pytest.raises(ValueError, match=r"parameters stored as row shards need row-sharded "
                                         r"gradients"):
        ZeroSharding(Communicator(0, 1), 1, param_rows={"w"})


def tiny_cfg(extra):
    base = {"training": {"steps": 2, "local_batch_size": 1, "global_batch_size": 2},
            "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3},
            "model": {"model_type": "gpt", "vocab_size": 32, "hidden_size": 16,
                      "num_layers": 1, "num_attention_heads": 2, "seq_length": 8},
            "parallelism": {"data_parallel_shard_strategy": "optim_grads_params"}}
    for key, value in extra.items():
        base.setdefault(key, {}).update(value)
    return load_config(base)


@pytest.mark.parametrize("extra,msg", [
    ({"training": {"jit": "layer"}},
     r"^training\.jit: must be 'none' with parallelism\.data_parallel_shard_strategy: "
     r"optim_grads_params .*got 'layer'"),
])
def test_the_config_refuses_what_sharded_parameters_cannot_run(monkeypatch, extra, msg):
    """Refused by the config (``--check``), before any model or communicator: on 2 ranks,
    where the parameters are split; on one process every strategy is the same run."""
    workers(monkeypatch, 2)
    with pytest.raises(ConfigError, match=msg):
        tiny_cfg(extra)
    workers(monkeypatch, 1)
    assert tiny_cfg(extra).parallelism.data_parallel_shard_strategy == "optim_grads_params"
    workers(monkeypatch, 2)
    assert tiny_cfg(dict(extra, parallelism={"data_parallel_shard_strategy": "optim_grads"}))


def test_sharded_parameters_run_multi_token_prediction(monkeypatch):
    """Each MTP depth is one FSDP unit (distributed/fsdp.py ``FSDPRunner``; msrun case
    ``dp2_fsdp2_mtp`` and the DeepSeek-V3 FSDP cases of tests/distributed/layout_cases.py):
    on 2 ranks, where the parameters are split, the config loads."""
    workers(monkeypatch, 2)
    cfg = tiny_cfg({"model": {"num_nextn_predict_layers": 1}})
    assert cfg.model.num_nextn_predict_layers == 1


@pytest.mark.parametrize("world,par,divides", [
    (2, {}, True),                                                      # dp 2 (ZeRO-1)
    (2, {"data_parallel_shard_strategy": "optim_grads_params"}, True),
    (4, {"tensor_parallel": 2, "sequence_parallel": True}, False),
    (4, {"tensor_parallel": 2, "sequence_parallel": True,
         "data_parallel_shard_strategy": "optim_grads"}, True),
    (4, {"pipeline_parallel": 2}, False),
    (4, {"context_parallel": 2}, False),
])
def test_gradient_division_runs_only_where_the_fsdp_reduction_divides(monkeypatch, world, par,
                                                                      divides):
    """``disable_gradient_division: False``: accepted where the run's data-parallel reduction
    is the FSDP one (distributed/fsdp.py divides), refused at the config naming the field
    elsewhere (before, tp / pp / cp runs summed without dividing, silently)."""
    workers(monkeypatch, world)
    extra = {"parallelism": {"data_parallel_shard_strategy": "optim",
                             "disable_gradient_division": False, **par},
             "model": {"num_layers": 2}}
    if divides:
        assert tiny_cfg(extra).parallelism.disable_gradient_division is False
        return
    with pytest.raises(ConfigError, match=r"^parallelism\.disable_gradient_division: False "
                                          r"\(divide the reduced gradients by data_parallel\) is "
                                          rf"not implemented with world {world} = .*only the "
                                          r"data_parallel_shard_strategy reduction divides.*set "
                                          r"it to True \(upstream's default\)$"):
        tiny_cfg(extra)
    extra["parallelism"]["disable_gradient_division"] = True
    assert tiny_cfg(extra).parallelism.disable_gradient_division is True


def test_gradient_division_is_refused_under_expert_parallel():
    from mindformers_core.config.shard_strategy import gradient_division_problem
    field, msg = gradient_division_problem(False, ["fsdp", "expert"], 2, "LAYOUT")
    assert field == "parallelism.disable_gradient_division"
    assert msg == ("False (divide the reduced gradients by data_parallel) is not implemented "
                   "with LAYOUT: its expert gradients are summed over edp undivided; set it "
                   "to True (upstream's default)")
    assert gradient_division_problem(True, ["tensor"], 1, "LAYOUT") is None
    assert gradient_division_problem(False, [], 1, "LAYOUT") is None   # one process
    assert gradient_division_problem(False, ["fsdp"], 1, "LAYOUT") is None


def test_apply_fsdp_is_the_identity_on_one_process():
    from mindformers_core.distributed.comm import Communicator
    from mindformers_core.distributed.fsdp import apply_fsdp
    from mindformers_core.distributed.grad_reduce import DataParallelGradReducer
    reducer = DataParallelGradReducer(Communicator(0, 1))
    sentinel = object()
    assert apply_fsdp(tiny_cfg({}), reducer, sentinel) == (reducer, sentinel)


def test_memory_plan_of_fully_sharded_parameters(monkeypatch):
    """--check and the start-of-run log: per-rank parameters, gradients and optimizer state
    are 1/dp of one process's, the layers count as recomputed, and one gathered unit (here
    the largest decoder layer, float32: weights + gradient + fp32 copy) is added."""
    from mindformers_core.core.memory_plan import param_counts, plan_memory
    monkeypatch.delenv("MS_WORKER_NUM", raising=False)
    cfg = tiny_cfg({"parallelism": {"data_parallel_shard_strategy": "optim_grads_params"}})
    one = plan_memory(cfg, 1, host_ram=2.0 ** 34)
    two = plan_memory(cfg, 2, host_ram=2.0 ** 34)
    for item in ("parameters", "gradients", "optimizer state"):
        assert two.items[item] * 2 == one.items[item], item
    assert "FSDP gathered unit" not in one.items and one.settings.recompute == "none"
    assert two.settings.recompute == "full"
    layer = param_counts(cfg.model).layers[0].total
    assert layer > 16 * 32    # the layer, not the embedding, is the largest unit
    assert two.items["FSDP gathered unit"] == layer * 12
    zero1 = plan_memory(tiny_cfg({"parallelism": {"data_parallel_shard_strategy": "optim"}}),
                        2, host_ram=2.0 ** 34)
    assert zero1.items["parameters"] == one.items["parameters"]
    assert zero1.items["optimizer state"] == two.items["optimizer state"]
