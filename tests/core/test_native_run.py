"""A damaged kernel cache changes nothing a run computes (issue 33 item 6): the same config
with ``MFC_NATIVE_CACHE`` at a fresh directory, then with a bit flipped in every cached
library, then with every cached library truncated, gives the same losses, bit for bit, and
exits 0, saying which kernels run."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                 reason="no C compiler on this machine")]


def run(tmp_path, name):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
         os.path.join(ROOT, "configs", "markov_check.yaml"), "--mode", "1",
         "--set", "training.steps=3", "--output_dir", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env=dict(os.environ, MFC_NATIVE_CACHE=str(tmp_path / "cache"),
                 MFC_NATIVE_KERNELS="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "host kernels     : Adam, norm, accumulate, scale in host C (optim/host)" \
        in proc.stdout
    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(x)["loss"] for x in fh if '"loss"' in x]


def libraries(tmp_path):
    directory = tmp_path / "cache" / "native"
    names = sorted(n for n in os.listdir(directory) if n.endswith(".so"))
    assert [n.split("-")[0] for n in names] == ["host_accumulate", "host_adam", "host_norm"]
    return [directory / n for n in names]


def test_a_flipped_bit_or_a_truncated_cached_kernel_gives_the_clean_losses(tmp_path):
    clean = run(tmp_path, "clean")
    assert len(clean) == 3
    for path in libraries(tmp_path):
        with open(path, "r+b") as fh:
            fh.seek(os.path.getsize(path) // 2)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0x01]))
    assert run(tmp_path, "flipped") == clean
    for path in libraries(tmp_path):
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 3)
    assert run(tmp_path, "truncated") == clean
