"""checkpoint.async_save: background writes hold exactly the step they were taken at, a
SIGKILL during a background write leaves only complete checkpoints (plus a temp file), and a
failed background write is raised on the training thread."""
import io
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.trainer import Trainer
from mindformers_core.checkpoint.async_writer import AsyncCheckpointWriter
from mindformers_core.checkpoint.store import list_checkpoints, load_checkpoint, \
    resolve_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cfg_dict(save_path, async_save):
    return {
        "training": {"steps": 10, "local_batch_size": 2, "global_batch_size": 2, "seed": 5},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "weight_decay": 0.01},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1.e-2, "warmup_steps": 0},
        "model": {"model_type": "gpt", "vocab_size": 64, "hidden_size": 32, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 8},
        "checkpoint": {"enable_save": True, "save_interleaved_steps": 1, "save_max": 5,
                       "save_path": save_path, "async_save": async_save},
    }


def run_steps(tmp, async_save, steps):
    t = Trainer(load_config(cfg_dict(str(tmp), async_save)), str(tmp), stream=io.StringIO())
    for _ in range(steps):
        t.train_step()
        t.save()
    t.async_writer.wait()
    return t


def tensors_of(path):
    return load_checkpoint(path).tensors


def test_async_checkpoints_equal_synchronous_ones(tmp_path):
    run_steps(tmp_path / "sync", False, 3)
    t = run_steps(tmp_path / "async", True, 3)
    assert t.async_writer.last_path.endswith("step00000003.safetensors")
    sync = list_checkpoints(str(tmp_path / "sync"))
    asyn = list_checkpoints(str(tmp_path / "async"))
    assert [s for s, _ in sync] == [s for s, _ in asyn] == [1, 2, 3]
    for (_, a), (_, b) in zip(sync, asyn):
        ta, tb = tensors_of(a), tensors_of(b)
        assert sorted(ta) == sorted(tb)
        for k in ta:
            np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def test_sigkill_during_background_write_leaves_complete_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    script = textwrap.dedent(f"""
        import io, os, signal, sys
        sys.path.insert(0, {ROOT!r})
        sys.path.insert(0, {os.path.join(ROOT, "tests", "trainer")!r})
        from mindformers_core.config import load_config
        from mindformers_core.trainer import Trainer
        from test_async_checkpoint import cfg_dict
        t = Trainer(load_config(cfg_dict({str(ckpt)!r}, True)), {str(tmp_path)!r},
                    stream=io.StringIO())
        for _ in range(2):
            t.train_step()
            t.save()
        t.async_writer.wait()
        t.train_step()
        def die_half_way(fh, data):
            fh.write(data[: len(data) // 2])
            fh.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        t.save(write_hook=die_half_way)
        while True:          # the training thread keeps stepping until the writer is killed
            t.train_step()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    names = sorted(os.listdir(ckpt))
    assert names[0].startswith(".mindformers_core_step00000003.safetensors.tmp-"), names
    assert names[1:] == ["mindformers_core_step00000001.safetensors",
                         "mindformers_core_step00000002.safetensors"]
    data = resolve_checkpoint(str(ckpt))
    assert data.step == 2
    # the surviving file is exactly what a synchronous run saves at step 2
    run_steps(tmp_path / "sync", False, 2)
    ref = tensors_of(list_checkpoints(str(tmp_path / "sync"))[-1][1])
    for k in ref:
        np.testing.assert_array_equal(data.tensors[k], ref[k], err_msg=k)


def test_background_error_is_raised_on_wait():
    w = AsyncCheckpointWriter()

    def fail():
        raise OSError("disk full")
    w.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        w.wait()
    assert w.wait() is None and not w.busy
