"""``parallelism.expert_parallel: 2`` on 2 msrun CPU workers == 1 process with the same global
batch (the tiny DeepSeek-V3 of configs/muon_deepseek_v3_tiny.yaml: 4 routed experts, top-2):
per-step loss and grad norm over 10 steps (rel 1e-4), with AdamW and with Muon (both comm
strategies) and with an expert capacity, the real Trainer on both sides (ZeRO-1 over both ranks, the default
data_parallel_shard -1, shards the dense state only).

Also checked: each rank holds its 2 whole experts (the single-process experts' halves at the
end of the run), records their ShardSpecs, keeps their optimizer state whole, applies the
single-process expert-bias update, and logs the tokens routed to each EP rank.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from ep_case import CASES, STEPS, reference  # noqa: E402
from msrun_util import read_metrics, rel_err  # noqa: E402
from pathlib import Path  # noqa: E402
from rank_layout import load_layouts, single_process  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("ep",)
EXPERTS = ("decoder.layers.1.mlp.experts.weight1", "decoder.layers.1.mlp.experts.weight2")
BIAS = "decoder.layers.1.mlp.router.expert_bias"
#: per-case bound (rel) on loss, grad norm and the experts against 1 process. The capacity case
#: gets the 1e-3 that DEVELOPERS.md gives amplifying configs: with a capacity the kept pairs are
#: a step function of the router scores, and in the suite's world-2 launch (every layout case in
#: turn in the same workers) its grad norm came out 5.1e-4 off at step 6 and its experts 1.4e-4,
#: with the same per-expert loads (run on its own the case is within 1e-4).
RTOL = {"adamw_capacity": 1e-3}


def bound(case: str) -> float:
    """The relative bound of ``case`` against 1 process (``RTOL``; 1e-4 for the others)."""
    return RTOL.get(case, 1e-4)


@pytest.fixture(scope="module")
def ep_runs(layout_matrix):
    """Case ``ep2`` of the layout matrix's world-2 launch (layout_cases.py)."""
    out = Path(layout_matrix.case_dir("ep2"))
    res = {}
    for name in CASES:
        for rank, layout in load_layouts(out, name, 2).items():
            res[name, rank] = layout
        res[name] = read_metrics(out / name)
    return res


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """One process per optimizer (the comm strategy is irrelevant on one rank)."""
    from ep_case import case_config
    out = {}
    for name in sorted({reference(c) for c in CASES}):
        out[name] = single_process(case_config(name, 1), tmp_path_factory.mktemp(f"single_{name}"))
        assert out[name]["model"].shard_specs() == {}
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_grad_norm_match_one_process(ep_runs, references, case):
    ref = references[reference(case)]["metrics"]
    got = ep_runs[case]
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, STEPS + 1))
    for g, w in zip(got, ref):
        assert g["loss"] == pytest.approx(w["loss"], rel=bound(case)), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=bound(case)), g["step"]
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-12)
        # every rank routes with the full router: the global loads are the 1-process ones
        got_layer, want_layer = g["moe"]["layers"]["1"], w["moe"]["layers"]["1"]
        assert got_layer["tokens_per_expert"] == want_layer["tokens_per_expert"]
        assert got_layer["dropped"] == want_layer["dropped"]
        # the aux losses are the means over every micro-batch of the step, as in one process
        assert g["aux_loss"] == pytest.approx(w["aux_loss"], rel=1e-4)
        assert got_layer["aux_loss"] == pytest.approx(want_layer["aux_loss"], rel=1e-4)
    if CASES[case][2] is not None:   # the capacity drops pairs, as in one process
        assert sum(r["moe"]["layers"]["1"]["dropped"] for r in ref) > 0
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.3       # the runs trained


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_its_whole_experts(ep_runs, references, case):
    ref = references[reference(case)]["params"]
    for rank in (0, 1):
        meta, experts = ep_runs[case, rank]
        for name in EXPERTS:
            full = ref[name].shape
            assert meta["specs"][name] == [list(full), 0, "ep", 2]
            assert meta["local_shapes"][name] == [2] + list(full[1:])
            # the state of the experts stays whole on their rank (not row-sharded by ZeRO)
            for key, shape in meta["state_shapes"].items():
                if key.endswith(name):
                    assert shape == [2] + list(full[1:]), key
            assert rel_err(experts[name], ref[name][2 * rank:2 * rank + 2]) < bound(case), name
        assert meta["split_again"] == ("the experts of this model are already split over "
                                       "expert parallel ranks")
        # the aux-loss-free bias update saw the global loads on both ranks
        assert np.array_equal(np.float32(meta["expert_bias"][BIAS]), ref[BIAS])
        assert np.abs(ref[BIAS]).max() > 0
    assert any(key.startswith(("adam_m", "muon_m")) for key in ep_runs[case, 0][0]["state_shapes"])


def test_deredundant_dispatch_moves_fewer_logical_bytes(ep_runs):
    """The same 10 steps: alltoall_deredundancy sends a token once per EP rank, so its
    all-to-all logical payload (CommStats, forward and backward) is below the pair dispatch's;
    the CPU emulation's wire bytes (a padded AllReduce of the same buffers) shrink with it."""
    for rank in (0, 1):
        plain = ep_runs["adamw", rank][0]["ep_comm"]
        dedup = ep_runs["adamw_dedup", rank][0]["ep_comm"]
        a2a = [c["logical"]["bytes"]["all_to_all"] for c in (plain, dedup)]
        assert dedup["logical"]["calls"]["all_to_all"] > plain["logical"]["calls"]["all_to_all"]
        assert a2a[1] < a2a[0], a2a
        print(f"rank {rank}: all_to_all logical bytes {a2a[0]:.0f} -> {a2a[1]:.0f} "
              f"({1 - a2a[1] / a2a[0]:.1%} less); wire bytes "
              f"{plain['wire']['total_bytes']:.0f} -> {dedup['wire']['total_bytes']:.0f}")


def test_logs_the_tokens_of_each_ep_rank(ep_runs):
    for row in ep_runs["adamw"]:
        load = row["moe"]["layers"]["1"]["tokens_per_expert"]
        assert row["moe"]["tokens_per_ep_rank"] == [sum(load[:2]), sum(load[2:])]
        # 4 sequences x 32 tokens x top-2 pairs routed in all
        assert sum(row["moe"]["tokens_per_ep_rank"]) == 4 * 32 * 2


# -- 4 ranks: dp 4 = ep 2 x edp 2, the expert gradients reduced over the edp replicas ----------
@pytest.fixture(scope="module")
def edp_run(layout_matrix):
    """Case ``ep2_edp2`` of the world-4 launch: ep_worker's ``adamw`` at global batch 8."""
    out = Path(layout_matrix.case_dir("ep2_edp2"))
    ranks = [np.load(out / f"adamw.rank{r}.npz") for r in range(4)]
    return {"metrics": read_metrics(out / "adamw"), "experts": ranks}


def test_four_ranks_with_expert_data_parallel_match_one_process(edp_run, tmp_path):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from ep_case import case_config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(case_config("adamw", 1, 8), str(tmp_path), overwrite=True)
    trainer.train()
    ref = read_metrics(tmp_path)
    for g, w in zip(edp_run["metrics"], ref):
        assert g["loss"] == pytest.approx(w["loss"], rel=1e-4), g["step"]
        assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4), g["step"]
    assert len(edp_run["metrics"]) == len(ref) == STEPS
    params = {p.name: p.asnumpy() for p in trainer.model.get_parameters()}
    for rank in range(4):   # ep rank = dp rank % 2; ranks 0, 2 (and 1, 3) are edp replicas
        e = rank % 2
        for name in EXPERTS:
            assert rel_err(edp_run["experts"][rank][name], params[name][2 * e:2 * e + 2]) < 1e-4
