"""Muon (both comm strategies, QK-Clip on) and AdamW on tensor-parallel shards: 2 msrun CPU
workers (tp 2), and 4 (tp 2 x dp 2 with ZeRO-1), vs one process on the full weights, 10 steps (``tp_muon_case``).

The workers write their shards of every parameter and of the optimizer state; this process
unshards them along the test-side ``ShardSpec`` s and compares with the single-process run
(relative 1e-5), checks that QK-Clip clipped heads (the ranks' counts add up to the
single-process count: each rank clips its local heads), and that under
``allgather_deredundency`` each rank ran Newton-Schulz only for the split weights it owns
(FLOPs from the full shapes' pieces, counted here with the closed form) plus the replicated
ones, the owners balanced. The CPU backend has no send/recv, so deredundency returns the
updates by all-gather; the ``_p2p`` case forces the send/recv path (the communicator's
all-reduce rendezvous on CPU) and must give the same result. On 4 workers (tp 2 x dp 2) the
optimizer state is also ZeRO-1-sharded over dp on top of the TP shards.
"""
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tp_muon_case as C  # noqa: E402
pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("tp_muon",)
NAMES = ("muon_allgather", "muon_deredundency", "muon_deredundency_p2p", "adamw")
assert NAMES == tuple(C.CASES)     # what case tp_muon2 of layout_cases.py runs


def run_workers(out, names, workers):
    return {(n, r): (dict(np.load(os.path.join(out, f"{n}.rank{r}.npz"))),
                     json.load(open(os.path.join(out, f"{n}.rank{r}.json"))))
            for n in names for r in range(workers)}


@pytest.fixture(scope="module")
def tp2(layout_matrix):
    """Case ``tp_muon2`` of the layout matrix's world-2 launch."""
    return run_workers(layout_matrix.case_dir("tp_muon2"), NAMES, 2)


@pytest.fixture(scope="module")
def references():
    import mindspore as ms
    ms.runtime.launch_blocking()
    return {"muon": C.run("muon_allgather"), "adamw": C.run("adamw")}


@pytest.fixture(scope="module")
def specs():
    from mindformers_core.models import build_model
    return C.tp_specs(build_model(C.MODEL, seed=7), 2)


def assert_matches(ref, got, specs, ranks):
    """Unsharded parameters and optimizer state of ``ranks`` (tp index order) == ``ref``."""
    from mindformers_core.distributed.shard_spec import unshard
    for kind, table in (("param", ref["params"]), ("state", ref["state"])):
        for key, want in table.items():
            pname = key if kind == "param" else key.split(".", 1)[1]
            parts = [got[r][0][f"{kind}.{key}"] for r in ranks]
            full = unshard(specs[pname], parts) if pname in specs else parts[0]
            if pname not in specs:   # replicated: the ranks' copies agree
                # to float32 rounding, not bit for bit: in the suite's world-2 launch (every
                # layout case in turn in the same workers) the two ranks' routed experts under
                # allgather_deredundency differed by 3e-8 at |w| <= 0.05 after 10 steps, while
                # the case run on its own is bit-equal (cause not found; bounded here)
                for other in parts[1:]:
                    np.testing.assert_allclose(other, parts[0], rtol=0,
                                               atol=1e-5 * np.abs(parts[0]).max(), err_msg=key)
            np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                                       err_msg=f"{kind} {key}")


@pytest.mark.parametrize("name", NAMES)
def test_sharded_matches_one_process(tp2, references, specs, name):
    ref = references["adamw" if name == "adamw" else "muon"]
    assert_matches(ref, {r: tp2[name, r] for r in (0, 1)}, specs, (0, 1))
    if name != "adamw":
        local = [tp2[name, r][1]["clipped"] for r in (0, 1)]
        assert min(ref["clipped"]) > 0
        assert [a + b for a, b in zip(*local)] == ref["clipped"]


def closed_form_flops(shape, ns_steps=5):
    """Newton-Schulz FLOPs of an (A, B) piece: ns_steps * (4 L s^2 + 2 s^3)."""
    big, small = max(shape), min(shape)
    return ns_steps * (4.0 * big * small ** 2 + 2.0 * small ** 3)


def full_pieces(name, shape):
    """NS pieces of a TP-split Muon weight's FULL shape (model: heads 4, dn 8, dr 4, dv 8)."""
    m = C.MODEL
    n, dn, dr, dv = (m["num_attention_heads"], m["qk_nope_head_dim"], m["qk_rope_head_dim"],
                     m["v_head_dim"])
    if name.endswith("linear_q_up_proj.weight"):
        return [(n * dn, shape[1]), (n * dr, shape[1])]
    if name.endswith("linear_kv_up_proj.weight"):
        return [(n * dn, shape[1]), (n * dv, shape[1])]
    if name.endswith("linear_fc1.weight"):
        return [(shape[0] // 2, shape[1])] * 2
    return [tuple(shape)]


def test_deredundency_splits_newton_schulz_work(tp2, specs):
    ag = [tp2["muon_allgather", r][1]["ns_flops"] for r in (0, 1)]
    assert ag[0] == ag[1] > 0
    for name in ("muon_deredundency", "muon_deredundency_p2p"):
        meta = [tp2[name, r][1] for r in (0, 1)]
        owners = meta[0]["owners"]
        assert owners == meta[1]["owners"]
        split_muon = {k for k in specs if "embedding" not in k and "output_layer" not in k}
        assert set(owners) == split_muon
        weight = {k: sum(closed_form_flops(p) for p in full_pieces(k, specs[k].full_shape))
                  for k in owners}
        owned = [sum(f for k, f in weight.items() if owners[k] == q) for q in (0, 1)]
        # every rank orthogonalises the replicated weights; allgather: every weight
        replicated = ag[0] - C.STEPS * sum(owned)
        assert replicated > 0
        for q in (0, 1):
            assert meta[q]["ns_flops"] == pytest.approx(C.STEPS * owned[q] + replicated,
                                                        rel=1e-12)
        # balanced: both own work, the loads differ by at most the biggest weight
        assert min(owned) > 0 and abs(owned[0] - owned[1]) <= max(weight.values())


def test_deredundency_transport(tp2):
    cpu = tp2["muon_deredundency", 0][1]["stats"]["calls"]
    p2p = tp2["muon_deredundency_p2p", 0][1]["stats"]["calls"]
    assert set(cpu) == {"all_gather"}      # CAPABILITIES: no send/recv on CPU
    assert p2p.get("send", 0) > 0 and p2p.get("recv", 0) > 0 and "all_gather" not in p2p


@pytest.fixture(scope="module")
def tp2dp2(layout_matrix):
    """Case ``tp_muon2_dp2`` of the world-4 launch."""
    return run_workers(layout_matrix.case_dir("tp_muon2_dp2"), tuple(C.CASES_2D), 4)


@pytest.mark.parametrize("name", tuple(C.CASES_2D))
def test_tp2_dp2_with_zero_matches_one_process(tp2dp2, references, specs, name):
    """4 workers: tp {0,1} {2,3} x dp {0,2} {1,3}, the optimizer state ZeRO-1-sharded over dp
    on top of the TP shards; each tp group holds the whole model, equal to one process."""
    ref = references["adamw" if name.startswith("adamw") else "muon"]
    for ranks in ((0, 1), (2, 3)):
        assert [tp2dp2[name, r][1]["tp"] for r in ranks] == [0, 1]
        assert_matches(ref, {r: tp2dp2[name, r] for r in ranks}, specs, ranks)
        local = [tp2dp2[name, r][1]["clipped"] for r in ranks]
        assert [a + b for a, b in zip(*local)] == ref["clipped"]
