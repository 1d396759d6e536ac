"""An unwritable save path or too little free space is an error at start, before step 1; a
failed save removes its temp file and keeps the previous checkpoint."""
import errno
import io
import os

import numpy as np
import pytest

from mindformers_core.config import ConfigError
from mindformers_core.trainer import Trainer
from mindformers_core.checkpoint.store import (CheckpointError, list_checkpoints,
                                                 load_checkpoint, save_checkpoint)
from mindformers_core.trainer.preflight import (check_free_space, estimate_checkpoint_bytes,
                                                preflight_run_dirs)
from tests.trainer.tiny_run import tiny_run_cfg


def cfg(**checkpoint):
    ck = {"enable_save": True, "save_interleaved_steps": 1}
    ck.update(checkpoint)
    return tiny_run_cfg(2, checkpoint=ck)


def test_save_path_that_cannot_be_created_fails_before_step_1(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad = str(blocker / "ckpt")                  # a directory below a regular file
    with pytest.raises(ConfigError, match=r"^checkpoint.save_path: cannot write to .*a_file/ckpt"
                                          r".*Not a directory; choose a writable directory"):
        Trainer(cfg(save_path=bad), str(tmp_path / "out"), stream=io.StringIO())
    assert not (tmp_path / "out" / "metrics.jsonl").exists()     # no step ran
    with pytest.raises(ConfigError, match=r"^--output_dir: cannot write to .*a_file"):
        Trainer(cfg(), str(blocker), stream=io.StringIO())


def test_read_only_save_path_fails_before_step_1(tmp_path):
    """Also as root, who could write there: the directory is marked read-only."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match=r"^checkpoint.save_path: cannot write to .*ro'?: "
                                              r".*is read-only \(mode 0o555\)"):
            Trainer(cfg(save_path=str(ro)), str(tmp_path / "out"), stream=io.StringIO())
        # a missing save path below a read-only directory
        with pytest.raises(ConfigError, match=r"is read-only \(mode 0o555\)"):
            Trainer(cfg(save_path=str(ro / "a" / "b")), str(tmp_path / "out"),
                    stream=io.StringIO())
        assert os.listdir(ro) == [] and not (tmp_path / "out" / "metrics.jsonl").exists()
    finally:
        ro.chmod(0o755)


def test_too_little_free_space_is_an_error_at_start(tmp_path):
    need = estimate_checkpoint_bytes([10, 20], with_optimizer=True)
    assert need == 4 * 30 * 4 + 2 ** 20
    assert estimate_checkpoint_bytes([10, 20], with_optimizer=False) == 4 * 30 + 2 ** 20
    with pytest.raises(ConfigError, match=r"^checkpoint.save_path: .* has 0.5 MiB free, one "
                                          r"checkpoint of this model needs about 1.0 MiB"):
        check_free_space(str(tmp_path), need, "checkpoint.save_path", free_bytes=2 ** 19)
    # the real filesystem cannot hold an exabyte checkpoint
    with pytest.raises(ConfigError, match=r"^--output_dir: .* MiB free, one checkpoint"):
        preflight_run_dirs(None, str(tmp_path), False, 10 ** 18, saving=True)
    preflight_run_dirs(None, str(tmp_path), False, need, saving=True)
    assert os.listdir(tmp_path) == []            # the write probe left nothing behind


def test_failed_save_removes_its_temp_file_and_keeps_the_previous(tmp_path):
    t = {"model.w": np.ones(4, np.float32)}
    save_checkpoint(str(tmp_path), "p", 1, t, {}, {})

    def disk_full(fh, data):
        fh.write(data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*p_step00000002"
                                              r".safetensors: No space left on device; the "
                                              r"previous checkpoints are kept"):
        save_checkpoint(str(tmp_path), "p", 2, t, {}, {}, write_hook=disk_full)
    assert sorted(os.listdir(tmp_path)) == ["p_step00000001.safetensors"]
    assert load_checkpoint(str(tmp_path / "p_step00000001.safetensors")).step == 1


def test_trainer_save_failure_is_a_checkpoint_error_without_temp_files(tmp_path):
    c = cfg()
    out = io.StringIO()
    t = Trainer(c, str(tmp_path), stream=out)

    def disk_full(fh, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    t.train()
    assert [s for s, _ in list_checkpoints(str(tmp_path / "checkpoint"))] == [1, 2]
    with pytest.raises(CheckpointError, match="No space left on device"):
        t.save(write_hook=disk_full)
    assert not [n for n in os.listdir(tmp_path / "checkpoint") if n.startswith(".")]
