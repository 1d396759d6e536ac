"""run_mindformer.py under failure: --check verifies the data files, a doctor FAIL exits 1,
run errors go to stderr, a closed pipe ends quietly, and --overwrite / the run-directory guard
through the CLI (subprocess, as users run it)."""
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = os.path.join(ROOT, "configs", "markov_check.yaml")


def run(*args, stdin=None):
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MS_WORKER_NUM")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def token_file(tmp_path, vocab=32, n=2000):
    from mindformers_core.tools.make_token_data import write_token_file
    ids = np.random.default_rng(0).integers(0, vocab, n)
    return write_token_file(ids, str(tmp_path / "t.bin"), "uint16", vocab_size=vocab)


def test_check_reports_verified_data_and_a_missing_file_is_exit_2(tmp_path):
    path = token_file(tmp_path)
    r = run("--config", QUICK, "--mode", "1", "--check", "--set", "train_dataset.type=TokenFile",
            "--set", f"train_dataset.data_path={path}")
    assert r.returncode == 0, r.stderr
    assert (f"data             : TokenFile {path}: 2,000 tokens (uint16, from sidecar "
            "t.bin.meta.json), 62 samples, every id < model.vocab_size 32 (verified)") in r.stdout
    r = run("--config", QUICK, "--mode", "1", "--check", "--set", "train_dataset.type=TokenFile",
            "--set", f"train_dataset.data_path={tmp_path / 'nope.bin'}")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: train_dataset.data_path: token file not found: "
                                f"'{tmp_path / 'nope.bin'}'")
    r = run("--config", QUICK, "--mode", "1", "--check", "--set", "model.vocab_size=16",
            "--set", "train_dataset.type=TokenFile", "--set", f"train_dataset.data_path={path}")
    assert r.returncode == 2 and "larger than model.vocab_size=16" in r.stderr
    r = run("--config", QUICK, "--mode", "1", "--check", "--json", "--set",
            "train_dataset.type=MindDataset", "--set", f"train_dataset.data_path={path}.mr")
    assert r.returncode == 2 and "MindRecord file not found" in r.stderr


def test_doctor_fail_exits_1_without_strict():
    r = run("--config", QUICK, "--mode", "1", "--check", "--json",
            "--set", "optimizer.loss_scale=1e38")
    assert r.returncode == 1, r.stderr
    verdicts = {v["item"]: v["status"] for v in json.loads(r.stdout)["verdicts"]}
    assert verdicts["loss_scale"] == "FAIL"
    assert "WARN" in verdicts.values()                   # WARN alone does not fail ...
    r = run("--config", QUICK, "--mode", "1", "--check", "--json")
    assert r.returncode == 0, r.stderr                   # ... without --strict


def test_check_into_a_closed_pipe_has_no_traceback():
    cmd = (f"{sys.executable} run_mindformer.py --config {QUICK} --mode 1 --check | head -n 1")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=120)
    assert r.stdout.startswith("config OK")
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr


def test_run_errors_go_to_stderr_and_second_run_needs_overwrite(tmp_path):
    out = str(tmp_path / "run")
    short = ["--set", "training.steps=2", "--set", "checkpoint.save_interleaved_steps=1"]
    r = run("--config", QUICK, "--mode", "1", "--output_dir", out, *short)
    assert r.returncode == 0, r.stderr
    first = {json.loads(x)["run_id"] for x in open(os.path.join(out, "metrics.jsonl"))}
    # a second run in the same directory is refused, naming the choices
    r = run("--config", QUICK, "--mode", "1", "--output_dir", out, *short)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: --output_dir: ") and first.pop() in line and "--overwrite" in line
    r = run("--config", QUICK, "--mode", "1", "--output_dir", out, "--overwrite", *short)
    assert r.returncode == 0, r.stderr
    assert os.listdir(os.path.join(out, "superseded"))
    # a run error (unusable checkpoint) is on stderr, not stdout
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00[1, 2]  ")
    r = run("--config", QUICK, "--mode", "1", "--output_dir", str(tmp_path / "r2"),
            "--set", f"checkpoint.load_path={bad}", *short)
    assert r.returncode == 1
    assert "ERROR: checkpoint" in r.stderr and "ERROR" not in r.stdout


def test_check_verifies_mindrecord_rows(tmp_path):
    from mindformers_core.tools.make_token_data import write_mindrecord
    ids = np.random.default_rng(0).integers(0, 32, 400)
    path = str(tmp_path / "d.mindrecord")
    write_mindrecord(ids, path, 32)
    base = ["--config", QUICK, "--mode", "1", "--check", "--set", "train_dataset.type=MindDataset",
            "--set", f"train_dataset.data_path={path}"]
    r = run(*base)
    assert r.returncode == 0, r.stderr
    assert f"MindDataset {path} (+ .db): 12 rows of seq_length 32, every id < model.vocab_size " \
           "32" in r.stdout
    r = run(*base, "--set", "model.vocab_size=8")
    assert r.returncode == 2 and "is outside [0, model.vocab_size=8)" in r.stderr, r.stderr
