"""Context-parallel core attention on 4 msrun CPU workers against one process (case ``cp``
of the layout matrix's world-4 launch).

``cp_worker.py`` runs ring (colossal) and ulysses on the cp groups {0, 1} {2, 3} (cp 2 x dp 2)
and ring, ulysses and hybrid (ulysses degree 2) on cp 4, for GPT-style and MLA-style heads.
Here every cp group's parts are put back in global order (``cp_layout.gather_sequence``) and
compared with ``models/layers.causal_attention`` on the full sequence: context and the gradients
w.r.t. q, k, v at rel 1e-5, the MAX over the group of max_logits, and each rank's own max_logits
against numpy's max over the query rows it covers; fp16 ring cases against the float32
result (rel 5e-3), their outputs in fp16. The communicator's counters give what
travelled; they are checked against the formulas of docs/context_parallel.md.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cp_worker import B, CASES, N, S, SHAPES  # noqa: E402
from msrun_util import read_cases, rel_err  # noqa: E402

from mindformers_core.distributed import cp_layout  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
WORKERS = 4
TOL = 1e-5
TOL_FP16 = 5e-3   # fp16 inputs against the float32 result on the same (fp16-rounded) inputs


def tol(case):
    return TOL_FP16 if case.endswith("fp16") else TOL


LAYOUT_GROUPS = ("cp",)


@pytest.fixture(scope="module")
def results(layout_matrix):
    """Case ``cp`` of the world-4 launch of the layout matrix (layout_cases.py)."""
    return read_cases(layout_matrix.case_dir("cp"), CASES, workers=WORKERS)


def cp_groups(results, case):
    return sorted({tuple(results[case, r][1]["members"]) for r in range(WORKERS)})


def test_every_case_ran_on_the_expected_groups(results):
    for case in CASES:
        want = [(0, 1), (2, 3)] if case.startswith("cp2") else [(0, 1, 2, 3)]
        assert cp_groups(results, case) == want, case


@pytest.mark.parametrize("case", CASES)
def test_context_and_gradients_match_one_process(results, case):
    for members in cp_groups(results, case):
        ref = results[case, members[0]][0]
        for name in ("ctx", "dq", "dk", "dv"):
            parts = [results[case, r][0][name] for r in members]
            full = cp_layout.gather_sequence(parts, axis=2)
            assert full.shape == ref["ref_" + name].shape
            assert rel_err(full, ref["ref_" + name]) < tol(case), (case, members, name)
    dtype = "Float16" if case.endswith("fp16") else "Float32"
    for r in range(WORKERS):   # context and gradients in the inputs' dtype, max_logits float32
        assert results[case, r][1]["dtypes"] == [dtype, "Float32", dtype, dtype, dtype]


@pytest.mark.parametrize("case", CASES)
def test_max_logits_max_reduce_to_the_full_sequence(results, case):
    for members in cp_groups(results, case):
        ref = results[case, members[0]][0]["ref_max_logits"]
        got = [results[case, r][0]["max_logits"] for r in members]
        assert all(g.shape == (N,) for g in got)
        assert rel_err(np.max(got, 0), ref) < tol(case)
        for r in members:   # each rank: the max over exactly the queries its docstring says
            assert rel_err(results[case, r][0]["max_logits"],
                           results[case, r][0]["rows_max"]) < tol(case), (case, r)
        if "ulysses" in case:
            assert all(rel_err(g, ref) < tol(case) for g in got)


@pytest.mark.parametrize("case", CASES)
def test_what_travels_follows_the_formulas(results, case):
    d, dv, dtype = SHAPES[case.rsplit("_", 1)[1]]
    itemsize = np.dtype(dtype).itemsize
    for r in range(WORKERS):
        meta = results[case, r][1]
        cp, degree = meta["cp"], meta["degree"]
        calls, nbytes = meta["stats"]["calls"], meta["stats"]["bytes"]
        ring = cp // degree if meta["method"] != "ulysses" else 1
        heads = N // (cp // ring)
        if ring > 1:
            # fwd: n-1 shifts of K,V; bwd: n-1 of K,V,dK,dV and 1 of dK,dV; the gradients are
            # float32, one buffer with K,V when those are float32, else a second one
            elems = B * heads * (S // ring) * (d + dv)
            kv, grads = elems * itemsize, elems * 4
            buffers = 1 if itemsize == 4 else 2
            assert calls["send"] == calls["recv"] == (ring - 1) * (1 + buffers) + 1
            assert nbytes["recv"] == (ring - 1) * (2 * kv + grads) + grads
            if itemsize == 4:
                assert nbytes["recv"] == (3 * ring - 2) * kv   # docs/context_parallel.md
            assert nbytes["send"] == 0.0
        else:
            assert "send" not in calls and "recv" not in calls
        if meta["method"] == "colossal":
            assert set(calls) == {"send", "recv"}
            continue
        # fwd: q,k,v as one buffer and the context back; bwd: their adjoints; + max_logits
        u = cp // ring
        qkv = B * N * (S // cp) * (2 * d + dv) * 4
        ctx = B * N * (S // cp) * dv * 4
        assert calls["all_to_all"] == 4 and calls["all_gather"] == 1
        assert nbytes["all_to_all"] == pytest.approx(2 * (u - 1) / u * (qkv + ctx))
        assert nbytes["all_gather"] == (u - 1) * heads * 4
