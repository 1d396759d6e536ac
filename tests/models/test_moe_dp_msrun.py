"""MoE under data parallelism: 2 msrun CPU workers x local batch 2 == 1 process with the same
global batch (2 micro-batches). The expert-bias update reads the tokens per expert of the
whole step summed over the ranks, so the logged loads, the expert biases and every weight
match the single process (rel 1e-4)."""
import io
import json
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "distributed"))

from msrun_util import rel_err  # noqa: E402
from moe_dp_worker import moe_dp_config  # noqa: E402
from pathlib import Path  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("moe_dp",)


def _rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def test_two_ranks_route_and_update_the_bias_like_one_process(tmp_path, layout_matrix):
    """The 2 workers: case ``moe_dp`` of the layout matrix's world-2 launch."""
    from mindformers_core.trainer import Trainer
    from mindformers_core.checkpoint.store import list_checkpoints, load_checkpoint
    one, two = tmp_path / "one", Path(layout_matrix.case_dir("moe_dp"))
    ref = Trainer(moe_dp_config(str(one)), str(one), stream=io.StringIO())
    ref.train()

    rows_1, rows_2 = _rows(one), _rows(two)
    for a, b in zip(rows_1, rows_2):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"])
    load_1 = rows_1[-1]["moe"]["layers"]["1"]["tokens_per_expert"]
    load_2 = rows_2[-1]["moe"]["layers"]["1"]["tokens_per_expert"]
    assert sum(load_2) == 4 * 32 * 2                 # both ranks' tokens of the step
    assert load_1 == load_2
    want = load_checkpoint(list_checkpoints(str(one / "ckpt"))[-1][1]).tensors
    got = load_checkpoint(list_checkpoints(str(two / "ckpt"))[-1][1]).tensors
    biases = [k for k in want if k.endswith("expert_bias")]
    assert biases and np.abs(want[biases[0]]).max() > 0
    for k in (k for k in want if k.startswith("model.")):
        assert rel_err(got[k], want[k]) < 1e-4, k
