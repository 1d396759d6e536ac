"""Held-out evaluation and greedy generation under tensor parallel 2 (sequence parallel), on
2 msrun workers (case ``eval_tp`` of the layout matrix: tests/distributed/eval_tp_worker.py), against one process on
the same global batch (tests/distributed/eval_tp_case.py): the training rows (rel 1e-4), the
eval_loss rows (rel 1e-5), the end-of-run greedy sample text (equal, 16 tokens and 50 tokens,
past seq_length), training after an evaluation bit-identical to a run without one, and the
greedy and the sampled ids (temperature 0.8, top-k, top-p, same seed) from the seeded
initial weights (equal). Expert parallel 2 on the tiny DeepSeek-V3:
test_eval_layouts_msrun.py."""
import json
import os
import re
import sys

import pytest

from msrun_util import read_metrics, rel_err

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("eval_tp",)


def _sample(log: str) -> str:
    """The text of the run log's ``sample (greedy, N tokens):`` line (after the prompt)."""
    m = re.search(r"sample \(greedy, (\d+) tokens\):\n(.*?)\noutput files", log, re.S)
    assert m, log[-2000:]
    return m.group(2)


def test_tensor_parallel_eval_and_sample_equal_one_process(tmp_path, layout_matrix):
    """The 2 workers: case ``eval_tp`` of the layout matrix's world-2 launch."""
    import eval_tp_case as case
    from pathlib import Path
    out = Path(layout_matrix.case_dir("eval_tp"))
    _, ref_log = case.run("eval", str(tmp_path / "one"))
    ref = read_metrics(tmp_path / "one")
    got = read_metrics(out / "eval")
    train = [r for r in ref if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 5))
    for key in ("loss", "grad_norm"):
        assert rel_err([r[key] for r in got if "loss" in r], [r[key] for r in train]) < 1e-4
    ref_eval = {r["step"]: r["eval_loss"] for r in ref if "eval_tokens" in r}
    got_eval = {r["step"]: r["eval_loss"] for r in got if "eval_tokens" in r}
    assert sorted(got_eval) == sorted(ref_eval) == [2, 4]
    for step in ref_eval:
        assert got_eval[step] == pytest.approx(ref_eval[step], rel=1e-5)
    # an evaluation changes no training state: the steps after it are those of a run without
    long_rows = read_metrics(out / "long")
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in got if "loss" in r] == [r[key] for r in long_rows if "loss" in r]
    # the samples: 16 tokens (prompt + 16 < seq_length) and 50 (past it) of the same weights;
    # greedy, so the 16 are the start of the 50
    ref_text = _sample(ref_log)
    assert _sample((out / "eval.log").read_text(encoding="utf-8")) == ref_text
    _, ref_long = case.run("long", str(tmp_path / "one_long"))
    long_text = _sample(ref_long)
    assert long_text.startswith(ref_text) and len(long_text) > len(ref_text)
    assert _sample((out / "long.log").read_text(encoding="utf-8")) == long_text
    with open(out / "untrained.json") as fh:
        untrained = json.load(fh)
    want = case.untrained_sample(case.untrained_model())
    assert len(want) == case.NEW_TOKENS and len(set(want)) > 5
    assert untrained["ids"] == want
    # sampled (temperature, top-k, top-p) from the gathered last position: the same draws
    from mindformers_core.models.generation import generate
    sampled = generate(case.untrained_model(), list(case.PROMPT), case.SAMPLED_TOKENS,
                       **case.SAMPLING)
    assert len(set(sampled)) > 5 and sampled != want[:case.SAMPLED_TOKENS]
    assert untrained["sampled"] == sampled
