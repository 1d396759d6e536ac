"""Sharded checkpoints of real model-parallel runs on 2 msrun CPU workers, resumed on one
process, and one-process checkpoints resumed under each layout.

Here: the one-process reference of each case of ``mp_ckpt_case`` (6 steps, checkpoints at 4
and 6). Case ``mp_ckpt`` of the layout matrix's world-2 launch (``mp_ckpt_worker.py``, every
feature in turn in the same workers) trains each on 2 workers (tensor
parallel 2 with sequence parallel, FSDP ``optim_grads_params``, expert parallel 2), every rank
writing its shards and rank 0 the index, then resumes the reference's one-process step-4
checkpoint under the same layout (steps 5-6 equal the reference's). Then: each 2-worker step-4
checkpoint resumed on one process gives the 2-worker run's own steps 5-6 (loss and grad_norm,
relative 1e-5), the merged checkpoint holds the one-process shapes, and
``tools/convert_checkpoint merge`` of the TP checkpoint gives the same tensors as the loader.
"""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mp_ckpt_case import CASES, SAVE_AT, STEPS, checkpoint_at, train  # noqa: E402
from msrun_util import read_metrics  # noqa: E402
from pathlib import Path  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("mp_ckpt",)
RESUMED = list(range(SAVE_AT + 1, STEPS + 1))
TOL = 1e-5


def by_step(run_dir):
    return {r["step"]: r for r in read_metrics(run_dir) if "loss" in r}


def assert_same_steps(got, want, tol=TOL):
    for s in RESUMED:
        for key in ("loss", "grad_norm"):
            assert abs(got[s][key] - want[s][key]) <= tol * abs(want[s][key]), (s, key, got[s],
                                                                                 want[s])


@pytest.fixture(scope="module")
def single(layout_matrix):
    """The one-process runs (layout_cases.prepare_mp_ckpt, before the launch)."""
    run = layout_matrix.prepared("mp_ckpt")
    return Path(run["dir"]), run["shapes"]


@pytest.fixture(scope="module")
def two_workers(layout_matrix, single):
    """Case ``mp_ckpt`` of the layout matrix's world-2 launch: every feature in turn in the
    same workers, each also resuming its one-process checkpoint."""
    return Path(layout_matrix.case_dir("mp_ckpt"))


@pytest.mark.parametrize("name", CASES)
def test_each_rank_wrote_its_shards_and_they_merge_to_full_tensors(two_workers, single, name):
    from mindformers_core.checkpoint.store import load_checkpoint
    from mindformers_core.checkpoint.sharded import shard_files_of
    index = checkpoint_at(str(two_workers / name), SAVE_AT)
    assert [os.path.basename(f)[-30:] for f in shard_files_of(index)] == [
        "rank00000-of-00002.safetensors", "rank00001-of-00002.safetensors"]
    data = load_checkpoint(index)
    want = single[1][name]
    got = {k[len("model."):]: v.shape for k, v in data.tensors.items() if k.startswith("model.")}
    assert got == want
    for key, arr in data.tensors.items():   # optimizer slots in their parameter's full shape
        if key.startswith("optim.") and key.split(".", 2)[2] in want and arr.ndim > 0:
            assert arr.shape == want[key.split(".", 2)[2]], key


@pytest.mark.parametrize("name", CASES)
def test_two_worker_checkpoint_resumes_on_one_process(two_workers, single, tmp_path, name):
    ckpt = checkpoint_at(str(two_workers / name), SAVE_AT)
    train(name, tmp_path, overrides=[f"checkpoint.load_path={ckpt}"])
    got = by_step(tmp_path)
    assert sorted(got) == RESUMED
    assert_same_steps(got, by_step(two_workers / name))
    # and the one-process run of the same global batch (the features' own tolerance)
    assert_same_steps(got, by_step(single[0] / name), 1e-4)


@pytest.mark.parametrize("name", CASES)
def test_one_process_checkpoint_resumes_under_each_layout(two_workers, single, name):
    """Loaded after the model's cut: each rank takes its shards of the full tensors."""
    got = by_step(two_workers / f"{name}_resumed")
    assert sorted(got) == RESUMED
    assert_same_steps(got, by_step(single[0] / name))


def test_convert_merge_of_the_tp_checkpoint(two_workers, tmp_path):
    from mindformers_core.tools.convert_checkpoint import main
    from mindformers_core.checkpoint.store import load_checkpoint
    index = checkpoint_at(str(two_workers / "tp"), SAVE_AT)
    merged = str(tmp_path / "one.safetensors")
    assert main(["merge", "--input", index, "--output", merged]) == 0
    want, got = load_checkpoint(index), load_checkpoint(merged)
    assert sorted(got.tensors) == sorted(want.tensors)
    for key, arr in want.tensors.items():
        np.testing.assert_array_equal(got.tensors[key], arr, err_msg=key)
