"""Context parallel in the real Trainer: msrun CPU workers against the 1-process Trainer on the
same global batch, per step (``cp_case.py``: the cases as data).

* 2 workers, one launch: cp2 colossal and cp2 ulysses on GPT (configs/markov_check.yaml) and on
  the tiny DeepSeek-V3 with Muon and QK-Clip active (threshold 1.0; its sequence-wise aux loss
  and expert-bias counts run over the cp group), and cp2 colossal on that DeepSeek-V3 with one
  MTP depth (its logged mtp_loss too);
* 4 workers, one launch: cp4 hybrid (ulysses degree 2) on GPT, and cp2 x dp2 colossal on GPT;
* under document masking (``reset_attention_mask`` and ``reset_position_ids``): cp2 colossal on
  GPT, cp2 ulysses on the DeepSeek-V3 with its MTP depth, cp4 hybrid on GPT; the one process
  runs the plain core on the whole mask, and its losses differ from the causal run's.

Per-step loss and grad_norm (DeepSeek-V3: also the QK-Clip max logit, the aux loss and the
MTP loss) within rel 1e-4 over 10 steps; under Muon every rank's final QK-Clip max logits
identical (MAX-reduced over every rank); each rank reads the data of its dp coordinate.
"""
import json
import os
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cp_case import CASES, METRICS, MODELS, RTOL, STEPS, cases_of, config  # noqa: E402
from msrun_util import read_metrics, rel_err  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("cp_train",)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The 1-process Trainer run of each model (the same global batch)."""
    import io
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    out = {}
    for model in MODELS:
        name = next(n for n, c in CASES.items() if c[1] == model)
        run_dir = str(tmp_path_factory.mktemp(f"single_{model}"))
        Trainer(config(name, run_dir, parallel=False), run_dir, stream=io.StringIO()).train()
        out[model] = read_metrics(run_dir)
    return out


@pytest.fixture(scope="module")
def two(layout_matrix):
    """Case ``cp_train2`` of the layout matrix's world-2 launch (layout_cases.py)."""
    return Path(layout_matrix.case_dir("cp_train2"))


@pytest.fixture(scope="module")
def four(layout_matrix):
    """Case ``cp_train4`` of the layout matrix's world-4 launch."""
    return Path(layout_matrix.case_dir("cp_train4"))


def assert_same_steps(got, want, name, metrics):
    assert len(got) == len(want) == STEPS, (name, len(got), len(want))
    for g, w in zip(got, want):
        for key in metrics:
            assert rel_err(g[key], w[key]) < RTOL, (name, g["step"], key, g[key], w[key])


def check_case(out, single, name):
    workers, model, _ = CASES[name]
    assert_same_steps(read_metrics(out / name), single[model], name, METRICS[model])
    ranks = [json.load(open(out / f"{name}.rank{r}.json")) for r in range(workers)]
    if model.startswith("dsv3"):   # Muon's QK-Clip MAX-reduces them over every rank
        assert all(r["max_logits"] == ranks[0]["max_logits"] for r in ranks), name
    assert [r["data_rank"] for r in ranks] == [r["coords"]["dp"] for r in ranks]


@pytest.mark.parametrize("name", cases_of(2))
def test_cp_on_two_workers_equals_one_process(two, single, name):
    check_case(two, single, name)


@pytest.mark.parametrize("name", cases_of(4))
def test_cp_on_four_workers_equals_one_process(four, single, name):
    check_case(four, single, name)


def test_document_masking_changes_the_one_process_run(single):
    """The documents cases would pass with the mask ignored if the data held no
    end-of-document id: the masked one-process losses differ from the causal ones by more
    than ten times the tolerance the cases are compared at (the tiny DeepSeek-V3's one
    end-of-document token per sample moves its first loss by 4e-4, later ones by 1e-3+)."""
    for masked, causal in (("gpt_docs", "gpt"), ("dsv3_mtp_docs", "dsv3_mtp")):
        got = [r["loss"] for r in single[masked]]
        assert rel_err(got, [r["loss"] for r in single[causal]]) > 10 * RTOL, masked
