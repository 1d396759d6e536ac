"""Quieter, clearer failures: the damaged newest checkpoint a directory resume skipped is named
in the run's final summary too, and an async save's failure comes before the "training
finished" summary (no summary claims success after it)."""
import io
import os

import pytest

from mindformers_core.checkpoint.store import CheckpointError, checkpoint_name
from mindformers_core.trainer import Trainer
from tests.trainer.tiny_run import tiny_run_cfg


def test_summary_names_the_damaged_checkpoint_a_directory_resume_skipped(tmp_path):
    ck = {"enable_save": True, "save_interleaved_steps": 2, "save_max": 5}
    Trainer(tiny_run_cfg(4, checkpoint=ck), str(tmp_path), stream=io.StringIO()).train()
    ckdir = tmp_path / "checkpoint"
    newest = ckdir / checkpoint_name("mindformers_core", 4)
    with open(newest, "r+b") as fh:
        fh.truncate(os.path.getsize(newest) - 10)
    log = io.StringIO()
    Trainer(tiny_run_cfg(6, checkpoint={**ck, "load_path": str(ckdir)}), str(tmp_path),
            stream=log).train()
    text = log.getvalue()
    summary = text[text.index("training finished: 6 steps"):]
    assert (f"WARNING: resumed from {ckdir / checkpoint_name('mindformers_core', 2)}, skipping 1 "
            f"unusable newer checkpoint(s): checkpoint {newest} is truncated or corrupt") \
        in summary, summary


def test_an_async_save_failure_comes_before_the_summary(tmp_path):
    ck = {"enable_save": True, "save_interleaved_steps": 10, "async_save": True}
    log = io.StringIO()
    t = Trainer(tiny_run_cfg(2, checkpoint=ck), str(tmp_path), stream=log)
    # the final checkpoint's name is taken by a directory: its rename fails
    os.makedirs(tmp_path / "checkpoint" / checkpoint_name("mindformers_core", 2))
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*"
                                              r"mindformers_core_step00000002.safetensors: Is a "
                                              r"directory"):
        t.train()
    assert "training finished" not in log.getvalue(), log.getvalue()
