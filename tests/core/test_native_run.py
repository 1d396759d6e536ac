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


def command(out):
    return [sys.executable, os.path.join(ROOT, "run_mindformer.py"), "--config",
            os.path.join(ROOT, "configs", "markov_check.yaml"), "--mode", "1",
            "--set", "training.steps=3", "--output_dir", str(out)]


def run(tmp_path, name):
    out = tmp_path / name
    proc = subprocess.run(command(out), capture_output=True, text=True, cwd=ROOT, timeout=600,
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


def hung_compiler(tmp_path):
    script = tmp_path / "hung-cc"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'cc.pid'}\nexec sleep 600\n")
    script.chmod(0o755)
    return str(script)


def test_a_hung_compiler_costs_the_budget_then_the_run_trains_on_mindspore(tmp_path):
    cc = hung_compiler(tmp_path)
    proc = subprocess.run(command(tmp_path / "out"), capture_output=True, text=True, cwd=ROOT,
                          timeout=600, env=dict(os.environ, CC=cc, MFC_NATIVE_KERNELS="1",
                                                MFC_NATIVE_CACHE=str(tmp_path / "cache"),
                                                MFC_NATIVE_COMPILE_BUDGET="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("host kernels     : MindSpore fallback for Adam, norm, accumulate, scale "
            f"({cc}: compiling ran past its 2 s budget)\n") in proc.stdout
    with open(tmp_path / "out" / "metrics.jsonl", encoding="utf-8") as fh:
        assert len([x for x in fh if '"loss"' in x]) == 3


def test_sigterm_during_a_compile_stops_the_run_at_once(tmp_path):
    import signal
    import time
    cc = hung_compiler(tmp_path)
    proc = subprocess.Popen(command(tmp_path / "out"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, CC=cc, MFC_NATIVE_KERNELS="1",
                                     MFC_NATIVE_CACHE=str(tmp_path / "cache")))
    pid_file = tmp_path / "cc.pid"
    deadline = time.monotonic() + 300
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and time.monotonic() - t0 < 60, out[-3000:]
    assert "received SIGTERM: finishing the current step, saving a checkpoint and exiting" in out
    assert (f"MindSpore fallback for Adam, norm, accumulate, scale ({cc}: compile interrupted "
            "by SIGTERM)") in out
    try:
        os.kill(int(pid_file.read_text()), 0)
        with open(f"/proc/{int(pid_file.read_text())}/stat") as fh:
            assert fh.read().split()[2] == "Z"      # reaped by init, or gone
    except ProcessLookupError:
        pass
