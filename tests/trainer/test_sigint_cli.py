"""Ctrl-C (SIGINT) to a training run is reported as SIGINT, not as the SIGTERM MindSpore's
runtime would turn it into, and still ends with a checkpoint and exit 0."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_sigint_is_named_sigint_and_saves(tmp_path):
    log = tmp_path / "out.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "run_mindformer.py", "--config", "configs/quickstart.yaml",
             "--mode", "1", "--output_dir", str(tmp_path / "run"), "--set", "training.steps=300"],
            cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=ROOT))
    t0 = time.monotonic()
    while not re.search(r"step: \[ *3/", log.read_text()):
        assert proc.poll() is None and time.monotonic() - t0 < 240, log.read_text()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 0, log.read_text()
    text = log.read_text()
    assert "received SIGINT: finishing the current step, saving a checkpoint" in text, text
    assert "SIGTERM" not in text
    assert "training interrupted" in text
    assert any(n.endswith(".safetensors") for n in os.listdir(tmp_path / "run" / "checkpoint"))
