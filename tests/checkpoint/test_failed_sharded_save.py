"""A failed sharded save leaves no part of itself (checkpoint/sharded_save.py
settle_rank_file): rank 1's write fails with ENOSPC at the writer seam, the barrier's flag
tells rank 0, and rank 0 removes the rank file it had finished; the directory resume takes the
previous checkpoint, and leftovers of a killed save (rank files without an index) are ignored
by name. One process plays both ranks' file writes; the two-worker run of the same failure is
tests/distributed/test_sharded_checkpoint_msrun.py (run C)."""
import errno
import os
import shutil

import pytest

from mindformers_core.checkpoint.sharded import rank_file_name, reshard, write_rank
from mindformers_core.checkpoint.sharded_save import settle_rank_file
from mindformers_core.checkpoint.store import (CheckpointError, checkpoint_name,
                                               list_checkpoints, resolve_checkpoint)
from tests.trainer.test_sharded_checkpoint import TP, full_data, write_ranks
from mindformers_core.core.parallel_dims import make_mesh


def disk_full(fh, data):
    fh.write(data[: len(data) // 3])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_sharded_save_removes_the_finished_rank_files(tmp_path):
    write_ranks(tmp_path, TP, lambda r: make_mesh(2, tp=2).coords(r), 2)   # step 7, complete
    before = sorted(os.listdir(tmp_path))
    data = full_data()
    name = checkpoint_name("ck", 9)
    written, errors = {}, {}
    for rank, hook in ((0, None), (1, disk_full)):
        coords = make_mesh(2, tp=2).coords(rank)
        local = reshard(data, TP, coords, None).tensors
        try:
            written[rank] = write_rank(str(tmp_path), name, 9, rank, 2, local, TP, coords,
                                       run_id=data.run_id, write_hook=hook)
        except CheckpointError as exc:
            errors[rank] = exc
    assert sorted(written) == [0] and sorted(errors) == [1]
    assert os.path.isfile(written[0])          # rank 0 finished before the barrier
    failed = bool(errors)                       # what broadcast_flag gives every rank
    with pytest.raises(CheckpointError) as err0:
        settle_rank_file(written[0], None, failed, name)
    assert str(err0.value) == (f"another rank could not write its part of checkpoint {name}; "
                               "the previous checkpoints are kept")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*ck_step00000009"
                                              r"\.rank00001-of-00002\.safetensors: No space "
                                              r"left on device"):
        settle_rank_file(None, errors[1], failed, name)
    assert sorted(os.listdir(tmp_path)) == before   # nothing of the failed save is left
    assert resolve_checkpoint(str(tmp_path)).step == 7


def test_leftover_rank_files_of_a_killed_save_are_ignored_by_name(tmp_path):
    index = write_ranks(tmp_path, TP, lambda r: make_mesh(2, tp=2).coords(r), 2)
    # a save of step 9 killed after its rank files, before the index
    for rank in (0, 1):
        shutil.copy(tmp_path / rank_file_name(os.path.basename(index), rank, 2),
                    tmp_path / rank_file_name(checkpoint_name("ck", 9), rank, 2))
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [7]
    assert resolve_checkpoint(str(tmp_path)).step == 7
