"""Two runs in one directory lose nothing: run ids in checkpoints and metrics rows, rotation
only within a lineage, a new run refusing another run's directory (or moving its files aside
with ``overwrite``), and a resume appending to its own metrics.jsonl."""
import io
import json
import os

import numpy as np
import pytest

from mindformers_core.config import ConfigError
from mindformers_core.trainer import Trainer
from mindformers_core.checkpoint.store import (checkpoint_run_id, list_checkpoints,
                                                 load_checkpoint, prune_checkpoints,
                                                 save_checkpoint)
from mindformers_core.trainer.run_dir import SUPERSEDED_DIR, metrics_run_id
from tests.trainer.tiny_run import tiny_run_cfg


def cfg(steps, **checkpoint):
    ck = {"enable_save": True, "save_interleaved_steps": 2, "save_max": 2}
    ck.update(checkpoint)
    return tiny_run_cfg(steps, checkpoint=ck)


def train(c, out, **kw):
    t = Trainer(c, str(out), stream=io.StringIO(), **kw)
    t.train()
    return t


def rows(out, name="metrics.jsonl"):
    with open(os.path.join(str(out), name)) as fh:
        return [json.loads(x) for x in fh]


def test_prune_only_touches_the_same_lineage(tmp_path):
    t = {"model.w": np.zeros(2, np.float32)}
    for step in (10, 11, 12):
        save_checkpoint(str(tmp_path), "p", step, t, {}, {}, run_id="old")
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path), "p", step, t, {}, {}, run_id="new")
    removed = prune_checkpoints(str(tmp_path), "p", keep=2, run_id="new")
    assert [os.path.basename(p) for p in removed] == ["p_step00000001.safetensors"]
    left = [(s, checkpoint_run_id(p)) for s, p in list_checkpoints(str(tmp_path))]
    assert left == [(2, "new"), (3, "new"), (10, "old"), (11, "old"), (12, "old")]


def test_second_run_in_the_same_directory_is_refused_then_overwrite_moves_files(tmp_path):
    first = train(cfg(6), tmp_path)
    ckpt_dir = tmp_path / "checkpoint"
    assert [s for s, _ in list_checkpoints(str(ckpt_dir))] == [4, 6]
    assert {r["run_id"] for r in rows(tmp_path)} == {first.run_id}
    assert load_checkpoint(str(ckpt_dir / "mindformers_core_step00000006.safetensors")).run_id \
        == first.run_id
    with pytest.raises(ConfigError) as err:
        Trainer(cfg(3), str(tmp_path), stream=io.StringIO())
    msg = str(err.value)
    assert msg.startswith("--output_dir: ") and f"run {first.run_id}" in msg
    for choice in ("checkpoint.load_path", "--output_dir", "--overwrite"):
        assert choice in msg
    # nothing was touched by the refused run
    assert [s for s, _ in list_checkpoints(str(ckpt_dir))] == [4, 6] and len(rows(tmp_path)) == 6

    second = train(cfg(3), tmp_path, overwrite=True)
    assert second.run_id != first.run_id
    assert [s for s, _ in list_checkpoints(str(ckpt_dir))] == [2, 3]
    assert {r["run_id"] for r in rows(tmp_path)} == {second.run_id} and len(rows(tmp_path)) == 3
    # the first run's files were moved aside, not deleted
    (old_ckpts,) = os.listdir(ckpt_dir / SUPERSEDED_DIR)
    assert old_ckpts.endswith(first.run_id)
    assert sorted(os.listdir(ckpt_dir / SUPERSEDED_DIR / old_ckpts)) == [
        "mindformers_core_step00000004.safetensors", "mindformers_core_step00000006.safetensors"]
    (old_run,) = os.listdir(tmp_path / SUPERSEDED_DIR)
    assert len(rows(tmp_path / SUPERSEDED_DIR / old_run)) == 6
    assert metrics_run_id(str(tmp_path / SUPERSEDED_DIR / old_run / "metrics.jsonl")) \
        == first.run_id


def test_shared_checkpoint_dir_of_another_run_is_refused(tmp_path):
    shared = str(tmp_path / "shared_ckpt")
    train(cfg(2, save_path=shared), tmp_path / "a")
    with pytest.raises(ConfigError, match=r"shared_ckpt.*mindformers_core_step00000002"):
        Trainer(cfg(2, save_path=shared), str(tmp_path / "b"), stream=io.StringIO())


def test_resume_appends_and_keeps_every_earlier_row(tmp_path):
    first = train(cfg(6, save_max=5), tmp_path)
    before = rows(tmp_path)
    ck4 = str(tmp_path / "checkpoint" / "mindformers_core_step00000004.safetensors")
    resumed = train(cfg(6, save_max=5, load_path=ck4), tmp_path)
    assert resumed.run_id == first.run_id           # a resume continues the lineage
    after = rows(tmp_path)
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6]
    assert after[:4] == before[:4]
    assert {r["run_id"] for r in after} == {first.run_id}
    # the rows the resume ran again are kept aside
    assert rows(tmp_path, "metrics.rewound.jsonl") == before[4:]
    # the resumed steps are bit-exact continuations
    assert [r["loss"] for r in after[4:]] == [r["loss"] for r in before[4:]]


def test_resume_into_another_runs_metrics_is_refused(tmp_path):
    train(cfg(2), tmp_path / "a")
    train(cfg(2), tmp_path / "b")
    ck = str(tmp_path / "a" / "checkpoint")
    with pytest.raises(ConfigError, match=r"Refusing to start this resumed run"):
        Trainer(cfg(4, load_path=ck), str(tmp_path / "b"), stream=io.StringIO())
