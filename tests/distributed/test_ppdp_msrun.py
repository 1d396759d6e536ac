"""Pipeline x data parallel on 4 msrun CPU workers (pp2 x dp2, ZeRO-1 or FSDP inside each stage) ==
1 process on the same global batch (issue [2/8]).

One msrun launch runs every case of ``ppdp_case.CASES`` through the real Trainer (10 steps,
global batch 8, local batch 2, lr 1e-3):

* ``gpt_pp2_dp2``: the GPT of configs/markov_check.yaml with AdamW under 1f1b;
* ``gpt_pp2_fsdp2_vpp2``: a 4-layer GPT, FSDP inside each stage (``optim_grads_params``: each
  stage's weights split over its dp group), interleave 2;
* ``gpt_pp2_fsdp_grads``: the GPT under ``optim_grads`` (gradients reduce-scattered over each
  stage's dp group), 1f1b, not resumed;
* ``dsv3_pp2_dp2_vpp2``: a 4-layer tiny DeepSeek-V3 with Muon, QK-Clip (threshold 0.05),
  expert bias, MoE aux loss and one MTP depth, interleave 2;
* ``dsv3_pp2_ep2``: the same under pp2 x ep2 (ep carved out of each stage's dp), 1f1b.

pp x tp x ep (interleaved, with MTP) runs with dp 2 on top as layout_cases.py's 8-worker
``upstream8_dsv3``.

This process runs the same configs on one process and compares the logged loss, grad_norm and
mtp_loss per step (relative 1e-4); then it resumes each pp2 x dp2 checkpoint of step 5 on one
process, and the msrun job resumed it on pp2 x dp2: both continue with the uninterrupted
steps.
"""
import os
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msrun_util import read_metrics  # noqa: E402
from ppdp_case import CASES, SAVE_AT, STEPS, WORKERS, resume_extra, run_case  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

LAYOUT_GROUPS = ("ppdp",)
RESUMED = [name for name, case in CASES.items() if case["resume"]]


@pytest.fixture(scope="module")
def ppdp_runs(layout_matrix):
    """Case ``ppdp`` of the layout matrix's world-4 launch (layout_cases.py)."""
    out = Path(layout_matrix.case_dir("ppdp"))
    log0 = open(Path(layout_matrix.launch(WORKERS)["out"]) / "logs" / "worker_0.log").read()
    return {"out": out, "log0": log0}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    return {name: read_metrics(run_case(name, str(out / name), parallel=False).output_dir)
            for name in CASES}


def assert_same_steps(got, want, steps, rel=1e-4):
    assert [r["step"] for r in got] == list(steps)
    ref = {r["step"]: r for r in want}
    for row in got:
        w = ref[row["step"]]
        for key in ("loss", "grad_norm", "mtp_loss"):
            assert (key in row) == (key in w), (key, row["step"])
            if key in w:
                assert row[key] == pytest.approx(w[key], rel=rel), (key, row["step"])
        assert row["lr"] == pytest.approx(w["lr"], rel=1e-9)
        assert row["skipped"] == w["skipped"] and row["clipped"] == w["clipped"]
        assert row.get("qk_clipped_heads") == w.get("qk_clipped_heads"), row["step"]


@pytest.mark.parametrize("case", list(CASES))
def test_pp2_dp2_equals_one_process(ppdp_runs, references, case):
    got = read_metrics(ppdp_runs["out"] / case)
    assert_same_steps(got, references[case], range(1, STEPS + 1))
    assert abs(got[-1]["loss"] - got[0]["loss"]) > 1e-3   # the runs trained


def test_the_dsv3_case_clipped_heads_and_logged_mtp(ppdp_runs):
    got = read_metrics(ppdp_runs["out"] / "dsv3_pp2_dp2_vpp2")
    assert sum(r.get("qk_clipped_heads") or 0 for r in got) > 0
    assert all(r.get("mtp_loss", 0) > 0 for r in got)
    assert "pipeline parallel: stage 0 of 2 (interleave 2, interleaved 1F1B, 2 micro-batches" \
        in ppdp_runs["log0"]


@pytest.mark.parametrize("case", RESUMED)
def test_pp2_dp2_checkpoint_resumes_on_one_process(ppdp_runs, references, case, tmp_path):
    from mindformers_core.checkpoint.store import load_checkpoint
    extra = resume_extra(os.path.join(ppdp_runs["out"], case))
    data = load_checkpoint(extra[0].split("=", 1)[1])
    trainer = run_case(case, str(tmp_path), parallel=False, extra=extra)
    # one file with every stage's whole weights and whole (ZeRO-gathered) optimizer state
    assert {k: v.shape for k, v in data.tensors.items() if k.startswith("model.")} == {
        f"model.{p.name}": tuple(p.shape) for p in trainer.model.get_parameters()}
    assert trainer.resumed_from == extra[0].split("=", 1)[1]
    assert_same_steps(read_metrics(tmp_path), references[case], range(SAVE_AT + 1, STEPS + 1))


@pytest.mark.parametrize("case", RESUMED)
def test_pp2_dp2_checkpoint_resumes_on_pp2_dp2(ppdp_runs, case):
    """Resumed on the same layout (each rank loads the whole file, keeps its stage and its
    ZeRO rows): the uninterrupted pp2 x dp2 steps."""
    got = read_metrics(ppdp_runs["out"] / f"{case}_resumed")
    want = read_metrics(ppdp_runs["out"] / case)
    assert_same_steps(got, want, range(SAVE_AT + 1, STEPS + 1), rel=1e-6)
