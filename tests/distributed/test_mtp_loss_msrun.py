"""The logged ``mtp_loss`` of a data-parallel run is the global batch's (the mean over the
ranks, ``DataParallelGradReducer.mean_over_ranks``): 2 msrun CPU workers x local batch 2 log
the same mtp_loss, loss and grad norm as 1 process with global batch 4 (2 micro-batches), with
the parameters fully sharded (each MTP depth one unit, distributed/fsdp.py ``FSDPRunner``)."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from msrun_util import read_metrics  # noqa: E402

LAYOUT_GROUPS = ("layouts",)


def test_mean_over_ranks_on_one_rank_is_the_value():
    from mindformers_core.distributed.comm import Communicator
    from mindformers_core.distributed.grad_reduce import DataParallelGradReducer
    from mindformers_core.trainer.grad_reducer import IdentityGradReducer
    assert DataParallelGradReducer(Communicator(0, 1)).mean_over_ranks(0.75) == 0.75
    assert IdentityGradReducer().mean_over_ranks(0.75) == 0.75


@pytest.mark.multiproc
@pytest.mark.slow
def test_two_ranks_log_the_global_mtp_loss(layout_matrix):
    """Case ``dp2_fsdp2_mtp`` of the layout matrix (layout_cases.LAYOUTS): trainer_case's run with
    MTP_OVERRIDES on 2 workers under optim_grads_params and on one process."""
    case = layout_matrix.case("dp2_fsdp2_mtp")
    got = read_metrics(layout_matrix.case_dir("dp2_fsdp2_mtp"))
    want = read_metrics(layout_matrix.reference_dir(case))
    assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 2, 3, 4]
    for g, w in zip(got, want):
        for key in ("mtp_loss", "loss", "grad_norm"):
            assert g[key] == pytest.approx(w[key], rel=1e-4), (g["step"], key)
    assert np.isfinite([r["mtp_loss"] for r in got]).all()
