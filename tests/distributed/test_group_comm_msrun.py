"""GroupCommunicator on real msrun CPU workers: every collective on every group, exact.

Two cases of the layout matrix run ``group_comm_worker.py`` (layout_cases.py): 2 workers
(tp 2: the tp group is the world) and 4 workers (tp 2 x dp 2: tp {0,1} {2,3}, dp {0,2} {1,3},
sub-groups, so the CPU emulations run). The worker compares each result with numpy from all
members' inputs (integer-valued float32: exact) and logs every call; here the byte counters are
checked against the formulas written out below, independently of the communicator's code.
The worker also runs a column-parallel then row-parallel linear (models/tensor_parallel.py) on
the tp group, forward and backward, against the one-process numpy result.
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("group_comm",)


@pytest.fixture(scope="module", params=[2, 4], ids=["2workers", "4workers_tp2_dp2"])
def results(request, layout_matrix):
    """Case ``group_comm2`` / ``group_comm4`` of the layout matrix (layout_cases.py)."""
    out = layout_matrix.case_dir(f"group_comm{request.param}")
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(request.param)]


def ring_bytes(op, g, n, receives):
    """Bytes received by one rank, ring algorithms (G ranks, n = this rank's input bytes)."""
    return {"all_reduce": 2 * (g - 1) / g * n, "all_gather": (g - 1) * n,
            "reduce_scatter": (g - 1) / g * n, "all_to_all": (g - 1) / g * n,
            "broadcast": n if receives else 0.0, "recv": n, "send": 0.0}[op]


def cpu_transport(op, g, n, receives, world):
    """The native collective the CPU backend issues for ``op``: (native op, bytes received).
    all_to_all is built on the gather of all inputs, so on the world group it is one AllGather."""
    if g == world and op in ("all_gather", "broadcast", "all_to_all"):
        native = "all_gather" if op == "all_to_all" else op
        return native, ring_bytes(native, g, n, receives)
    # everything else is an AllReduce SUM of: G stacked inputs (gathers), or one input
    size = {"all_gather": g * n, "all_to_all": g * n}.get(op, n)
    return "all_reduce", 2 * (g - 1) / g * size


def test_every_collective_is_exact_on_every_group(results):
    for res in results:
        assert res["backend"] == "cpu"
        assert len(res["checks"]) > 50
        wrong = [c for c in res["checks"] if c[1] != 0.0]
        assert wrong == []
        names = {c[0].split("/")[0] for c in res["checks"]}
        for op in ("all_reduce", "all_gather0", "all_gather1", "reduce_scatter0",
                   "reduce_scatter1", "all_to_all01", "all_to_all10", "world_interleave"):
            assert op in names
        assert any(n.startswith("recv") for n in names)
        assert "tp_linear" in names


def test_sub_groups_were_exercised_on_four_workers(results):
    world = results[0]["world"]
    groups = {c[0].split("/")[-1] for c in results[0]["checks"]
              if not c[0].startswith(("world_interleave", "recv", "tp_linear"))}
    assert groups == ({"tp", "dp", "world"} if world == 4 else {"tp", "world"})


def test_byte_counts_follow_the_ring_formulas(results):
    for res in results:
        want, calls = {}, {}
        for op, g, n, receives in res["calls"]:
            want[op] = want.get(op, 0.0) + ring_bytes(op, g, n, receives)
            calls[op] = calls.get(op, 0) + 1
        assert res["stats"]["calls"] == calls
        assert res["stats"]["bytes"] == pytest.approx(want)


def test_transport_counts_the_native_collectives_issued(results):
    for res in results:
        want = {}
        for op, g, n, receives in res["calls"]:
            native, nbytes = cpu_transport(op, g, n, receives, res["world"])
            want[native] = want.get(native, 0.0) + nbytes
        assert res["transport"]["bytes"] == pytest.approx(want)


def test_bad_arguments_are_refused_with_the_reason(results):
    for rank, res in enumerate(results):
        src = 2 if rank < 2 else 0   # the first rank outside the tp group (2 on 2 workers)
        tp = "(0, 1)" if rank < 2 else "(2, 3)"
        assert res["errors"] == [
            f"broadcast: source rank {src} is not in the tp group {tp} of rank {rank}",
            "reduce_scatter: dim 0 of shape (3, 2) is not divisible by the tp group size 2",
            "all_to_all: dim 1 of shape (2, 3) is not divisible by the tp group size 2"]
