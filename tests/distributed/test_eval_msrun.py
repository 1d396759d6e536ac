"""Held-out evaluation is data-parallel aware: 2 msrun workers (local batch 2 each; case
``eval_dp`` of the layout matrix's world-2 launch, eval_dp_case.py) give the held-out loss of
1 process with local batch 4, at every evaluation (relative 1e-4)."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import eval_dp_case  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("eval_dp",)


def _evals(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        rows = [json.loads(x) for x in fh]
    return {r["step"]: (r["eval_loss"], r["eval_tokens"]) for r in rows if "eval_tokens" in r}


def test_two_workers_evaluate_like_one_process(tmp_path, layout_matrix):
    out = layout_matrix.case_dir("eval_dp")
    eval_dp_case.run(str(tmp_path / "one"), 4)
    dp, ref = _evals(out), _evals(tmp_path / "one")
    assert sorted(dp) == sorted(ref) == [2, 4]
    for step in ref:
        assert dp[step][1] == ref[step][1] == 3 * 4 * 16     # every rank's tokens counted
        assert dp[step][0] == pytest.approx(ref[step][0], rel=1e-4)
