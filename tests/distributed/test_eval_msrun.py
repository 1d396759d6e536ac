"""Held-out evaluation is data-parallel aware: 2 msrun workers (local batch 2 each) give the
held-out loss of 1 process with local batch 4, at every evaluation (relative 1e-4)."""
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _config(path, local_batch):
    cfg = {
        "training": {"steps": 4, "local_batch_size": local_batch, "global_batch_size": 4,
                     "seed": 9, "eval_interval": 2, "eval_steps": 3},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 3e-3, "warmup_steps": 0},
        "model": {"vocab_size": 256, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 16},
        "train_dataset": {"type": "PydocText", "validation_split": 0.02},
        "checkpoint": {"enable_save": False},
    }
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return str(path)


def _evals(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        rows = [json.loads(x) for x in fh]
    return {r["step"]: (r["eval_loss"], r["eval_tokens"]) for r in rows if "eval_tokens" in r}


def test_two_workers_evaluate_like_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dp_cfg = _config(tmp_path / "dp.yaml", 2)
    cmd = (f"python run_mindformer.py --config {dp_cfg} --mode 1 "
           f"--output_dir {tmp_path / 'dp'}")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "msrun_launcher.sh"), cmd, "2",
                           str(port), str(tmp_path / "logs"), "True", "300"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    one = subprocess.run([sys.executable, "run_mindformer.py", "--config",
                          _config(tmp_path / "one.yaml", 4), "--mode", "1", "--output_dir",
                          str(tmp_path / "one")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    dp, ref = _evals(tmp_path / "dp"), _evals(tmp_path / "one")
    assert sorted(dp) == sorted(ref) == [2, 4]
    for step in ref:
        assert dp[step][1] == ref[step][1] == 3 * 4 * 16     # every rank's tokens counted
        assert dp[step][0] == pytest.approx(ref[step][0], rel=1e-4)
