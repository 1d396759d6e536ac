"""Sharded checkpoints of a real 2-worker data-parallel + ZeRO-1 run (msrun, CPU) and their
resume on one process, and the other way round.

One single-process reference run (6 steps, a checkpoint every 2), then case ``sharded_ckpt``
of the layout matrix's world-2 launch (``sharded_ckpt_worker.py``): run A trains to step 4 on 2 workers, each rank writing its
part of every checkpoint (its ZeRO-1 rows of the AdamW state and, by default
``remove_redundancy: False``, the replicated weights too; rank 0 the index); run B resumes the
reference's one-process step-4 checkpoint on 2 workers; run D resumes run A's step 4 on 2
workers with ``load_balanced`` (each rank reads one of the two rank files), 2 read threads and
``remove_redundancy: True``. Here: run A's step-4 checkpoint is resumed on one process; its
steps 5-6 (loss, grad_norm, lr) equal the reference's, and so do run B's and run D's; run D's
step-6 checkpoint holds each piece once, split over both ranks, and merges to the reference's.
Run C: rank 1 cannot write its rank file, so both ranks stop with their own message, no
index is written and rank 0's finished rank file is removed. E: a balanced load of a copy of run A's step 4 with a flipped byte in rank
file 1: the ranks read one file each, and both raise the reading rank's error.
"""
import io
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from layout_cases import STOP_AT  # noqa: E402
from msrun_util import rel_err  # noqa: E402
from pathlib import Path  # noqa: E402
from trainer_case import STEPS, trainer_config  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("sharded_ckpt",)


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return {r["step"]: r for r in (json.loads(line) for line in fh if line.strip())}


def assert_steps_match(got, want, steps):
    assert sorted(got) == list(steps)
    for s in steps:
        assert abs(got[s]["loss"] - want[s]["loss"]) <= 1e-5 * abs(want[s]["loss"]), s
        assert abs(got[s]["grad_norm"] - want[s]["grad_norm"]) <= \
            1e-5 * abs(want[s]["grad_norm"]), s
        assert got[s]["lr"] == pytest.approx(want[s]["lr"], rel=1e-12)


@pytest.fixture(scope="module")
def single(layout_matrix):
    """The one-process reference (layout_cases.prepare_sharded_ckpt, before the launch)."""
    run = layout_matrix.prepared("sharded_ckpt")
    return dict(run, metrics=read_metrics(run["out"]))


@pytest.fixture(scope="module")
def two_workers(layout_matrix, single):
    """Case ``sharded_ckpt`` of the layout matrix's world-2 launch (sharded_ckpt_worker)."""
    return Path(layout_matrix.case_dir("sharded_ckpt"))


def test_each_rank_wrote_its_part_and_rank0_the_index(two_workers, single):
    from mindformers_core.checkpoint.store import list_checkpoints, load_checkpoint
    from mindformers_core.checkpoint.file_io import read_header
    from mindformers_core.checkpoint.sharded import INDEX_FORMAT, shard_files_of
    ckpt = two_workers / "a" / "checkpoint"
    index = str(ckpt / f"mindformers_core_step{STOP_AT:08d}.safetensors")
    assert [p for _, p in list_checkpoints(str(ckpt))][-1] == index
    assert read_header(index, os.path.getsize(index))["__metadata__"]["format"] == INDEX_FORMAT
    names = sorted(os.listdir(ckpt))
    for rank in (0, 1):
        assert f"mindformers_core_step{STOP_AT:08d}.rank{rank:05d}-of-00002.safetensors" in names
    # remove_redundancy: False, upstream's default: each rank file holds every weight
    model_keys = [{k for k, _ in pieces_of(p) if k.startswith("model.")}
                  for p in shard_files_of(index)]
    assert model_keys[0] == model_keys[1] and len(model_keys[0]) > 3
    # merged, it is the one-process checkpoint of the same step (the DP sums round alike)
    got, want = load_checkpoint(index).tensors, load_checkpoint(single["step4"]).tensors
    keys = {k for k in want if k.startswith(("model.", "optim."))}
    assert any(k.startswith("optim.adam_m.") for k in keys)
    assert keys == {k for k in got if k.startswith(("model.", "optim."))}
    for key in keys:
        assert rel_err(got[key], want[key]) < 1e-5, key
    # the 2-worker steps are the one-process ones
    assert_steps_match(read_metrics(two_workers / "a"), single["metrics"], range(1, STOP_AT + 1))


def test_two_worker_checkpoint_resumes_on_one_process(two_workers, single, tmp_path):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ckpt = two_workers / "a" / "checkpoint"
    trainer = Trainer(trainer_config(str(tmp_path), [f"checkpoint.load_path={ckpt}"]),
                      str(tmp_path), stream=io.StringIO())
    assert trainer.resumed_from.endswith(f"_step{STOP_AT:08d}.safetensors")
    trainer.train()
    assert_steps_match(read_metrics(tmp_path), single["metrics"], range(STOP_AT + 1, STEPS + 1))


def test_one_process_checkpoint_resumes_on_two_workers(two_workers, single):
    from mindformers_core.checkpoint.store import load_checkpoint
    assert_steps_match(read_metrics(two_workers / "b"), single["metrics"],
                       range(STOP_AT + 1, STEPS + 1))
    final = two_workers / "b" / "checkpoint" / f"mindformers_core_step{STEPS:08d}.safetensors"
    got = load_checkpoint(str(final)).tensors
    want = load_checkpoint(os.path.join(single["dir"], final.name)).tensors
    for key in (k for k in want if k.startswith(("model.", "optim."))):
        assert rel_err(got[key], want[key]) < 1e-5, key


def pieces_of(path):
    """``{(key, offset)}`` of the pieces a rank file holds."""
    from mindformers_core.checkpoint.file_io import read_header
    pieces = json.loads(read_header(path, os.path.getsize(path))["__metadata__"]["pieces"])
    return {(k, tuple(p["offset"])) for k, p in pieces.items()}


def test_balanced_load_and_deduplicated_save_on_two_workers(two_workers, single):
    from mindformers_core.checkpoint.store import load_checkpoint
    from mindformers_core.checkpoint.sharded import shard_files_of
    assert_steps_match(read_metrics(two_workers / "d"), single["metrics"],
                       range(STOP_AT + 1, STEPS + 1))
    final = two_workers / "d" / "checkpoint" / f"mindformers_core_step{STEPS:08d}.safetensors"
    files = [pieces_of(p) for p in shard_files_of(str(final))]
    assert len(files) == 2 and not files[0] & files[1]      # every piece once ...
    assert all(any(k.startswith("model.") for k, _ in f) for f in files)   # ... balanced
    got = load_checkpoint(str(final)).tensors
    want = load_checkpoint(os.path.join(single["dir"], final.name)).tensors
    keys = {k for k in want if k.startswith(("model.", "optim."))}
    assert keys == {k for k in got if k.startswith(("model.", "optim."))}
    for key in keys:
        assert rel_err(got[key], want[key]) < 1e-5, key


def test_a_rank_that_cannot_write_stops_every_rank_and_no_index_is_written(two_workers):
    run_c = two_workers / "c"
    rank0 = (run_c / "error.rank0.txt").read_text()
    rank1 = (run_c / "error.rank1.txt").read_text()
    assert rank0 == ("another rank could not write its part of checkpoint "
                     "mindformers_core_step00000002.safetensors; the previous checkpoints are kept")
    assert rank1.startswith("cannot write checkpoint ") and \
        rank1.endswith("mindformers_core_step00000002.rank00001-of-00002.safetensors: Is a "
                       "directory; the previous checkpoints are kept")
    assert not (run_c / "checkpoint" / "mindformers_core_step00000002.safetensors").exists()
    # rank 0 finished its rank file before the barrier; the failed save removed it
    assert not (run_c / "checkpoint" /
                "mindformers_core_step00000002.rank00000-of-00002.safetensors").exists()


def test_a_damaged_file_in_a_balanced_load_stops_every_rank_with_its_reader_s_error(two_workers):
    run_e = two_workers / "e"
    reads = [json.loads((run_e / f"read.rank{r}.json").read_text()) for r in (0, 1)]
    assert sorted(reads[0] + reads[1]) == [0, 1] and len(reads[0]) == 1
    errors = [(run_e / f"error.rank{r}.txt").read_text() for r in (0, 1)]
    assert errors[0] == errors[1]
    assert errors[0].startswith("checkpoint ") and errors[0].endswith(
        "mindformers_core_step00000004.rank00001-of-00002.safetensors is corrupt: its header or "
        "tensor data does not match its sha256 digest")
