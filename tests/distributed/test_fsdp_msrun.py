"""Fully sharded data parallel on 2 msrun CPU workers == 1 process with the same global batch.

Case ``fsdp`` of the layout matrix's world-2 launch (layout_cases.py) runs every case of
``dp_case.FSDP_CASES`` that shards (tiny GPT and tiny DeepSeek-V3, AdamW and Muon with both
comm strategies, ``optim_grads`` and ``optim_grads_params``) for 10 steps, then the real
Trainer under ``optim_grads_params``. This process runs the 1-process references and compares
per-step loss and grad norm (relative 1e-4), the final parameters (the ranks' shards merged
with the ``shard_specs`` they report), the full optimizer state, and the per-rank bytes of
parameters, gradients and optimizer state (about half of one process's).
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from dp_case import DIVIDED_SUFFIX, FSDP_CASES, FSDP_SHARDED, STEPS, fsdp_reference  # noqa: E402
from msrun_util import read_cases, read_metrics, rel_err  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

SHARDED = FSDP_SHARDED
REFERENCES = sorted({fsdp_reference(n) for n in SHARDED})
DIVIDED = [n for n in SHARDED if n.endswith(DIVIDED_SUFFIX)]
SAME = [n for n in SHARDED if n not in DIVIDED]   # the 1-process run, bit for bit or nearly
TOL = 1e-4


LAYOUT_GROUPS = ("fsdp",)


@pytest.fixture(scope="module")
def fsdp_results(layout_matrix):
    out = layout_matrix.case_dir("fsdp")
    return {"results": read_cases(out, SHARDED), "run_dir": os.path.join(out, "trainer")}


@pytest.fixture(scope="module")
def references():
    import mindspore as ms
    from mindformers_core.distributed.comm import Communicator
    from dp_case import run_case
    ms.runtime.launch_blocking()
    return {name: run_case(name, Communicator(0, 1)) for name in REFERENCES}


def merged_params(results, name):
    """Every final parameter of case ``name``: the shards of both ranks merged by their
    ShardSpec (``shard_spec.unshard``), the replicated ones as rank 0 holds them."""
    from mindformers_core.distributed.shard_spec import ShardSpec, unshard
    (got0, meta0), (got1, meta1) = results[name, 0], results[name, 1]
    assert meta0["shard_specs"] == meta1["shard_specs"]
    out = {}
    for key in got0:
        if not key.startswith("param."):
            continue
        pname = key[len("param."):]
        spec = meta0["shard_specs"].get(pname)
        if spec is None:
            np.testing.assert_array_equal(got0[key], got1[key])   # replicas agree bit for bit
            out[pname] = got0[key]
        else:
            full, dim, n = spec
            out[pname] = unshard(ShardSpec(tuple(full), dim, "dp", n), [got0[key], got1[key]])
    return out


@pytest.mark.parametrize("case", SAME)
def test_two_ranks_equal_one_rank_with_the_same_global_batch(fsdp_results, references, case):
    ref = references[fsdp_reference(case)]
    assert len(ref["losses"]) == STEPS
    for rank in (0, 1):
        got, meta = fsdp_results["results"][case, rank]
        assert meta["world"] == 2
        assert rel_err(got["losses"], ref["losses"]) < TOL
        assert rel_err(got["norms"], ref["norms"]) < TOL
        state_keys = {k[len("state."):] for k in got if k.startswith("state.")}
        assert state_keys == set(ref["state_dict"])
        for key, want in ref["state_dict"].items():   # the collective, full-format state
            assert rel_err(got[f"state.{key}"], want) < TOL, key
    params = merged_params(fsdp_results["results"], case)
    assert set(params) == set(ref["params"])
    for name, want in ref["params"].items():
        assert rel_err(params[name], want) < TOL, name
    assert ref["param_change"] > 1e-3


@pytest.mark.parametrize("case", SAME)
def test_per_rank_bytes_are_about_half(fsdp_results, references, case):
    ref = references[fsdp_reference(case)]
    params_sharded = FSDP_CASES[case][2] == "optim_grads_params"
    for rank in (0, 1):
        meta = fsdp_results["results"][case, rank][1]
        assert 0.45 <= meta["grad_bytes"] / ref["grad_bytes"] <= 0.55
        assert 0.45 <= meta["state_bytes"] / ref["state_bytes"] <= 0.55
        ratio = meta["param_bytes"] / ref["param_bytes"]
        assert (0.45 <= ratio <= 0.55) if params_sharded else ratio == 1.0
        # the model reports the layout of exactly the parameters stored as shards
        assert bool(meta["shard_specs"]) == params_sharded


@pytest.mark.parametrize("case", DIVIDED)
def test_disable_gradient_division_false_divides_the_reduced_gradient_by_dp(
        fsdp_results, references, case):
    """Step 1 sees the same weights: the same loss and half the gradient norm (2 ranks); the
    smaller norm is clipped less afterwards, so later steps differ."""
    ref = references[fsdp_reference(case)]
    for rank in (0, 1):
        got, _ = fsdp_results["results"][case, rank]
        assert abs(got["losses"][0] - ref["losses"][0]) <= TOL * abs(ref["losses"][0])
        assert abs(got["norms"][0] - ref["norms"][0] / 2) <= TOL * ref["norms"][0] / 2


def test_muon_deredundency_splits_newton_schulz_work_under_fsdp(fsdp_results):
    ag = [fsdp_results["results"]["muon_mla_optim_grads_params", r][1] for r in (0, 1)]
    dr = [fsdp_results["results"]["muon_mla_optim_grads_params_deredundency", r][1]
          for r in (0, 1)]
    assert ag[0]["ns_flops"] == ag[1]["ns_flops"] > 0
    for r in (0, 1):
        assert dr[r]["ns_flops"] < 0.7 * ag[r]["ns_flops"]
    assert dr[0]["ns_owner"] == dr[1]["ns_owner"] and set(dr[0]["ns_owner"].values()) == {0, 1}


@pytest.fixture(scope="module")
def single_trainer(tmp_path_factory):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from trainer_case import FSDP_OVERRIDES, trainer_config
    out = tmp_path_factory.mktemp("single_fsdp")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(trainer_config(str(out), FSDP_OVERRIDES), str(out)).train()
    return read_metrics(out)


def test_trainer_under_optim_grads_params_matches_one_process(fsdp_results, single_trainer):
    from trainer_case import STEPS as TRAINER_STEPS
    got = read_metrics(fsdp_results["run_dir"])
    assert [r["step"] for r in got] == list(range(1, TRAINER_STEPS + 1))
    for row, want in zip(got, single_trainer):
        assert abs(row["loss"] - want["loss"]) <= TOL * abs(want["loss"])
        assert abs(row["grad_norm"] - want["grad_norm"]) <= TOL * abs(want["grad_norm"])
        assert row["lr"] == pytest.approx(want["lr"], rel=1e-12)
