"""Held-out evaluation and the end-of-run greedy sample under fully sharded parameters
(``optim_grads_params``, 2 workers), pipeline parallel 2 (2 workers) and tensor parallel 2 x
data parallel 2 (4 workers), each on msrun workers (tests/distributed/eval_layout_worker.py)
against one process on the quickstart config as the issue's check runs it
(``eval_tp_case.QUICK``): the training rows (rel 1e-4), the eval_loss rows at steps 5 and 10
(rel 1e-5) and the 16-token greedy sample text (equal), which rank 0 logs in the run log's
``sample (greedy, N tokens):`` line (under pp rank 0 is the first stage)."""
import os
import sys
from pathlib import Path

import pytest

from msrun_util import read_metrics, rel_err
from test_eval_tp_msrun import _sample

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("eval_layouts",)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    import eval_tp_case as case
    run_dir = tmp_path_factory.mktemp("one") / "quick"
    _, log = case.run("quick", str(run_dir))
    return read_metrics(run_dir), _sample(log)


@pytest.mark.parametrize("name", ["fsdp", "pp2", "tp2dp2"])
def test_layout_eval_and_sample_equal_one_process(layout_matrix, one_process, name):
    """Cases ``eval_<name>`` of the layout matrix (layout_cases.py)."""
    out = Path(layout_matrix.case_dir(f"eval_{name}"))
    ref, ref_text = one_process
    got = read_metrics(out / name)
    assert [r["step"] for r in got] == [r["step"] for r in ref] == list(range(1, 11))
    for key in ("loss", "grad_norm"):
        assert rel_err([r[key] for r in got], [r[key] for r in ref]) < 1e-4, key
    ref_eval = {r["step"]: (r["eval_loss"], r["eval_tokens"]) for r in ref if "eval_tokens" in r}
    got_eval = {r["step"]: (r["eval_loss"], r["eval_tokens"]) for r in got if "eval_tokens" in r}
    assert sorted(got_eval) == sorted(ref_eval) == [5, 10]
    for step, (loss, tokens) in ref_eval.items():
        assert got_eval[step][1] == tokens
        assert got_eval[step][0] == pytest.approx(loss, rel=1e-5)
    assert _sample((out / f"{name}.log").read_text(encoding="utf-8")) == ref_text
