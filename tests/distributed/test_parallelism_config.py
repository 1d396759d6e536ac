"""`parallelism:` section: data_parallel_shard semantics (docs/data_parallel.md), model-parallel
sizes (pipeline, context) fixed to 1, and upstream's text for a `data_parallel` key."""
import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.parallelism import ParallelismConfig, resolve_dp_shard
from mindformers_core.config.layout import parallel_steps


def base(**sections):
    d = {"training": {"steps": 10, "local_batch_size": 1, "global_batch_size": 4},
         "optimizer": {"type": "AdamW"},
         "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3}}
    d.update(sections)
    return d


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for key in ("MS_ROLE", "MS_WORKER_NUM", "RANK_ID"):
        monkeypatch.delenv(key, raising=False)


def msrun_world(monkeypatch, n, role="MS_WORKER"):
    monkeypatch.setenv("MS_ROLE", role)
    monkeypatch.setenv("MS_WORKER_NUM", str(n))


@pytest.mark.parametrize("shard,dp,want", [
    (-1, 4, (1, 4)),    # default: shard over every DP rank
    (1, 4, (4, 1)),     # replicate
    (2, 4, (2, 2)),     # HSDP
    (4, 4, (1, 4)),
    (8, 1, (1, 1)),     # one data-parallel rank: nothing to shard
    (-1, 1, (1, 1)),
])
def test_dp_shard_derivation_matches_upstream(shard, dp, want):
    assert resolve_dp_shard(shard, dp) == want
    assert ParallelismConfig(data_parallel_shard=shard).dp_shard(dp) == want


def test_dp_shard_above_dp_is_an_error_not_clamped():
    # upstream clamps 8 to dp 2; here it is refused (issue [5/8] item 8; docs/data_parallel.md)
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel_shard: "
                                          r"data_parallel_shard\(8\) is larger than "
                                          r"data_parallel\(2\)"):
        resolve_dp_shard(8, 2)


@pytest.mark.parametrize("shard", [0, -2])
def test_dp_shard_rejects_zero_and_below_minus_one(shard):
    with pytest.raises(ConfigError, match=rf"^parallelism\.data_parallel_shard: must be -1 "
                                          rf"\(shard the optimizer state over all data-parallel "
                                          rf"ranks\) or >= 1, got {shard}"):
        load_config(base(parallelism={"data_parallel_shard": shard}))


def test_dp_shard_must_divide_dp(monkeypatch):
    with pytest.raises(ConfigError, match=r"data_parallel_shard\(4\) must divide "
                                          r"data_parallel\(6\)"):
        resolve_dp_shard(4, 6)
    msrun_world(monkeypatch, 6)
    d = base(training={"steps": 10, "local_batch_size": 1, "global_batch_size": 6},
             parallelism={"data_parallel_shard": 4})
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel_shard: "
                                          r"data_parallel_shard\(4\) must divide"):
        load_config(d)
    d["parallelism"]["data_parallel_shard"] = 3
    assert load_config(d).parallelism.dp_shard(6) == (2, 3)


def test_data_parallel_key_gives_upstream_text():
    with pytest.raises(ConfigError) as err:
        load_config(base(parallelism={"data_parallel": 2}))
    msg = str(err.value)
    assert msg.startswith("parallelism.data_parallel: unknown key")
    assert "Unknown configuration keys for ParallelismConfig: ['data_parallel']" in msg
    assert "world_size // (tensor_parallel * pipeline_parallel * context_parallel)" in msg
    assert "'data_parallel_shard'" in msg


def test_context_parallel_runs_with_data_tensor_and_pipeline_parallel(monkeypatch):
    msrun_world(monkeypatch, 4)
    d = base(training={"steps": 10, "local_batch_size": 1, "global_batch_size": 2},
             parallelism={"context_parallel": 2})
    dims = load_config(d).parallel_dims()
    assert (dims.cp, dims.dp) == (2, 2)
    d["parallelism"].update(tensor_parallel=2, sequence_parallel=True)
    dims = load_config(d).parallel_dims()
    assert (dims.cp, dims.tp, dims.dp) == (2, 2, 1)
    d["parallelism"].update(tensor_parallel=1, sequence_parallel=False, pipeline_parallel=2)
    dims = load_config(d).parallel_dims()
    assert (dims.cp, dims.pp, dims.dp) == (2, 2, 1)
    # each stage's cp chunks after its pipeline cut (config/layout.py parallel_steps)
    assert parallel_steps(dims) == ["pipeline", "context"]
    d["parallelism"].update(data_parallel_shard_strategy="optim_grads_params")
    assert parallel_steps(load_config(d).parallel_dims()) == ["pipeline", "fsdp", "context"]


def test_world_size_comes_from_msrun_in_workers_and_scheduler(monkeypatch):
    from mindformers_core.launch_env import (env_rank, env_world_size, is_msrun_scheduler,
                                                  launched_by_msrun)
    assert (launched_by_msrun(), env_world_size(), env_rank()) == (False, 1, 0)
    msrun_world(monkeypatch, 2)
    monkeypatch.setenv("RANK_ID", "1")
    assert (launched_by_msrun(), is_msrun_scheduler(), env_world_size(), env_rank()) == \
        (True, False, 2, 1)
    msrun_world(monkeypatch, 2, role="MS_SCHED")
    assert (launched_by_msrun(), is_msrun_scheduler(), env_world_size(), env_rank()) == \
        (True, True, 2, 0)
    # the scheduler resolves the config exactly as the workers do (dp = 2)
    plan = load_config(base(training={"steps": 10, "local_batch_size": 1,
                                      "global_batch_size": 4})).plan()
    assert plan.data_parallel == 2 and plan.num_accumulation_steps == 2
