"""Pipeline parallel on 2 msrun CPU workers (one stage each) == 1 process, same global batch.

Case ``pp2`` of the layout matrix's world-2 launch runs every case of ``pp_case.CASES`` with ``pipeline_parallel: 2`` through the
real Trainer (10 steps, 4 micro-batches of 1 sequence):

* ``gpt_1f1b``: the tiny GPT with AdamW under 1f1b (one layer per stage), a checkpoint at
  step 5 and 10;
* ``gpt_tied_uneven``: 4 layers split 1 + 3, the output layer tied to the embedding (its
  gradient summed over the first and last stage);
* ``dsv3_interleaved``: a 4-layer tiny DeepSeek-V3 (MLA, MoE with expert bias and aux loss)
  with Muon and QK-Clip, interleave 2 (layers 0,2 on stage 0 and 1,3 on stage 1).

This process runs the same configs on one process and compares the logged loss and grad_norm
per step (relative 1e-4), then resumes the pp2 checkpoint of step 5 on one process and
checks that steps 6..10 are the uninterrupted ones; the msrun job also resumed it on the
same 2 stages, with the same check.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msrun_util import read_metrics  # noqa: E402
from pathlib import Path  # noqa: E402
from pp_case import CASES, RESUME_CASE, SAVE_AT, STEPS, resume_extra, run_case  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("pp",)


@pytest.fixture(scope="module")
def pp_runs(layout_matrix):
    """Case ``pp2`` of the layout matrix's world-2 launch (layout_cases.py)."""
    out = Path(layout_matrix.case_dir("pp2"))
    log0 = open(Path(layout_matrix.launch(2)["out"]) / "logs" / "worker_0.log").read()
    return {"out": out, "log0": log0}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    return {name: read_metrics(run_case(name, str(out / name), pipeline=False).output_dir)
            for name in CASES}


def assert_same_steps(got, want, steps):
    assert [r["step"] for r in got] == list(steps)
    ref = {r["step"]: r for r in want}
    for row in got:
        w = ref[row["step"]]
        assert row["loss"] == pytest.approx(w["loss"], rel=1e-4), row["step"]
        assert row["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4), row["step"]
        assert row["lr"] == pytest.approx(w["lr"], rel=1e-9)
        assert row["skipped"] == w["skipped"] and row["clipped"] == w["clipped"]


@pytest.mark.parametrize("case", list(CASES))
def test_two_stages_equal_one_process(pp_runs, references, case):
    got = read_metrics(pp_runs["out"] / case)
    assert_same_steps(got, references[case], range(1, STEPS + 1))
    # the runs trained: the loss moved
    assert abs(got[-1]["loss"] - got[0]["loss"]) > 1e-3


def test_interleaved_case_ran_muon_qk_clip_on_both_stages(pp_runs, references):
    got = read_metrics(pp_runs["out"] / "dsv3_interleaved")
    ref = references["dsv3_interleaved"]
    clipped = [r.get("qk_clipped_heads") for r in got]
    assert clipped == [r.get("qk_clipped_heads") for r in ref]
    assert sum(c or 0 for c in clipped) > 0
    assert "pipeline parallel: stage 0 of 2 (interleave 2, interleaved 1F1B" in pp_runs["log0"]
    assert "stage 0: layers 0-0,2-2; stage 1: layers 1-1,3-3" in pp_runs["log0"]
    assert "pipeline_parallel_microbatch_size 1 is overwritten with the accumulation count 4" \
        in pp_runs["log0"]


def test_pp2_checkpoint_resumes_on_one_process(pp_runs, references, tmp_path):
    from mindformers_core.checkpoint.store import load_checkpoint
    extra = resume_extra(os.path.join(pp_runs["out"], RESUME_CASE))
    ckpt = extra[0].split("=", 1)[1]
    data = load_checkpoint(ckpt)
    stages = data.state["pipeline_stages"]
    assert stages["embedding.word_embeddings.weight"] == 0
    assert stages["decoder.layers.1.mlp.linear_fc1.weight"] == 1
    assert stages["output_layer.weight"] == 1
    trainer = run_case(RESUME_CASE, str(tmp_path), pipeline=False, extra=extra)
    assert trainer.resumed_from == ckpt
    # every entry is the owner stage's whole tensor (a rank holds only its stage's weights)
    assert {k: v.shape for k, v in data.tensors.items() if k.startswith("model.")} == {
        f"model.{p.name}": tuple(p.shape) for p in trainer.model.get_parameters()}
    assert_same_steps(read_metrics(tmp_path), references[RESUME_CASE],
                      range(SAVE_AT + 1, STEPS + 1))


def test_pp2_checkpoint_resumes_on_pp2(pp_runs, references):
    """The same checkpoint resumed on the 2 stages (each loads the whole model, then
    releases the other stage's parameters) continues with the uninterrupted steps."""
    got = read_metrics(pp_runs["out"] / f"{RESUME_CASE}_resumed")
    assert_same_steps(got, references[RESUME_CASE], range(SAVE_AT + 1, STEPS + 1))
