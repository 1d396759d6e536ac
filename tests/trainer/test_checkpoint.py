"""Checkpoint files: round trip, atomic write under SIGKILL, truncation/corruption detection,
fallback to the previous checkpoint, pruning to save_max."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mindformers_core.checkpoint.store import (CheckpointError, list_checkpoints,
                                                 load_checkpoint, prune_checkpoints,
                                                 resolve_checkpoint, save_checkpoint)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tensors(step):
    return {"model.w": np.full((4, 3), step, np.float32), "optim.adam_m.w": np.arange(12.0).reshape(4, 3),
            "rng.numpy_keys": np.arange(5, dtype=np.uint32)}


def _save(d, step, prefix="run"):
    return save_checkpoint(str(d), prefix, step, _tensors(step), {"train_state": {"step": step}},
                           {"training": {"steps": 10}}, {"model.w": "bfloat16"})


def test_round_trip(tmp_path):
    path = _save(tmp_path, 3)
    assert os.path.basename(path) == "run_step00000003.safetensors"
    data = load_checkpoint(path)
    assert data.step == 3 and data.state == {"train_state": {"step": 3}}
    assert data.config == {"training": {"steps": 10}} and data.dtypes == {"model.w": "bfloat16"}
    for k, v in _tensors(3).items():
        np.testing.assert_array_equal(data.tensors[k], v)
        assert data.tensors[k].dtype == v.dtype


def test_truncated_file_is_detected_and_directory_falls_back(tmp_path):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    size = os.path.getsize(newest)
    with open(newest, "r+b") as fh:
        fh.truncate(size - 10)
    with pytest.raises(CheckpointError, match=r"truncated or corrupt.*other checkpoints in that "
                                              r"directory: \['run_step00000001.safetensors'\]"):
        resolve_checkpoint(newest)
    messages = []
    data = resolve_checkpoint(str(tmp_path), log=messages.append)
    assert data.step == 1
    assert len(messages) == 1 and "skipping unusable checkpoint" in messages[0]


def test_header_cut_short_is_detected(tmp_path):
    path = _save(tmp_path, 1)
    with open(path, "r+b") as fh:
        fh.truncate(30)
    with pytest.raises(CheckpointError, match="is truncated: header claims"):
        load_checkpoint(path)
    with open(path, "r+b") as fh:
        fh.truncate(5)
    with pytest.raises(CheckpointError, match="is truncated: 5 bytes, no header"):
        load_checkpoint(path)


def test_flipped_bit_is_detected_by_digest(tmp_path):
    path = _save(tmp_path, 1)
    with open(path, "r+b") as fh:
        fh.seek(-3, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-3, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointError, match="does not match its sha256 digest"):
        load_checkpoint(path)


def test_every_checkpoint_unusable_and_missing_paths(tmp_path):
    path = _save(tmp_path, 1)
    with open(path, "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(CheckpointError, match="every checkpoint in .* is unusable"):
        resolve_checkpoint(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"no checkpoint \(\*_stepNNNNNNNN.safetensors\)"):
        resolve_checkpoint(str(empty))
    with pytest.raises(CheckpointError, match="no such file or directory"):
        resolve_checkpoint(str(tmp_path / "nope"))
    other = tmp_path / "other.safetensors"
    import safetensors.numpy as stn
    stn.save_file({"a": np.zeros(2, np.float32)}, str(other))
    with pytest.raises(CheckpointError, match="is not a mindformers_core.checkpoint/2 file"):
        load_checkpoint(str(other))


def test_prune_keeps_the_newest(tmp_path):
    for s in (1, 2, 3, 4):
        _save(tmp_path, s)
    _save(tmp_path, 9, prefix="other")
    removed = prune_checkpoints(str(tmp_path), "run", keep=2)
    assert sorted(os.path.basename(p) for p in removed) == ["run_step00000001.safetensors",
                                                             "run_step00000002.safetensors"]
    assert [s for s, _ in list_checkpoints(str(tmp_path))] == [3, 4, 9]


def test_sigkill_during_write_leaves_previous_checkpoint_loadable(tmp_path):
    """A process killed in the middle of writing step 2 leaves step 1 intact and usable."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {ROOT!r})
        import numpy as np
        from mindformers_core.checkpoint.store import save_checkpoint
        t = {{"model.w": np.ones((256, 256), np.float32)}}
        save_checkpoint({str(tmp_path)!r}, "run", 1, t, {{"s": 1}}, {{}})
        def die_half_way(fh, data):
            fh.write(data[: len(data) // 2])
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        save_checkpoint({str(tmp_path)!r}, "run", 2, t, {{"s": 2}}, {{}}, write_hook=die_half_way)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    names = sorted(os.listdir(tmp_path))
    assert names[0].startswith(".run_step00000002.safetensors.tmp-"), names
    assert names[1:] == ["run_step00000001.safetensors"]
    data = resolve_checkpoint(str(tmp_path))
    assert data.step == 1 and data.state == {"s": 1}
    # the next save removes the dead writer's temp file
    _save(tmp_path, 3)
    prune_checkpoints(str(tmp_path), "run", keep=5)
    assert not any(n.startswith(".") for n in os.listdir(tmp_path))
