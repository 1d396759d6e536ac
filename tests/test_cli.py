"""run_mindformer.py: exit codes, one-line errors, plan output (subprocess, as users run it)."""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
SEED_41_MODEL = os.path.join(FIX, "seed_4_1_with_model.yaml")


def run(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("MS_ROLE", "MS_WORKER_NUM")}
    return subprocess.run([sys.executable, os.path.join(ROOT, "run_mindformer.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


@pytest.mark.timed
def test_check_valid_exits_0_fast_and_prints_plan():
    t0 = time.perf_counter()
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check")
    elapsed = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "steps            : 1000" in out
    assert "warmup steps     : 10" in out              # int(1000 * 0.01)
    assert "accumulation     : 2" in out               # 4 // (2 * 1)
    assert "global batch     : 4" in out
    assert elapsed < 5.0, f"--check took {elapsed:.2f} s"


def test_check_invalid_exits_2_one_line():
    r = run("--config", os.path.join(FIX, "invalid_betas.yaml"), "--mode", "1", "--check")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: optimizer.betas: expected 2 values in [0, 1), got [0.9]"]
    assert "Traceback" not in r.stderr


def test_set_overrides_and_json():
    # --fine-tuning: 20 steps of pretraining from scratch have no warmup, a doctor FAIL (exit 1)
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--json", "--fine-tuning",
            "--set", "training.steps=20", "--set", "optimizer.betas=[0.9,0.99]")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plan"]["total_steps"] == 20 and doc["plan"]["num_accumulation_steps"] == 2
    assert doc["config"]["optimizer"]["betas"] == [0.9, 0.99]


def test_bad_override_exits_2():
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--set", "optimizer.lr_foo=1")
    assert r.returncode == 2
    assert r.stderr.startswith("error: optimizer.lr_foo: unknown key")
    assert "Traceback" not in r.stderr


def test_mode_0_is_a_clear_error():
    r = run("--config", SEED_41_MODEL, "--mode", "0", "--check")
    assert r.returncode == 2
    assert "graph mode is not supported" in r.stderr and "--mode 1" in r.stderr


def test_mode_other_than_0_1():
    r = run("--config", SEED_41_MODEL, "--mode", "2", "--check")
    assert r.returncode == 2 and "--mode 2: unknown mode; use --mode 1" in r.stderr


def test_missing_required_args():
    r = run("--config", SEED_41_MODEL)
    assert r.returncode == 2 and "--mode" in r.stderr


def test_missing_config_file():
    r = run("--config", "/nonexistent.yaml", "--mode", "1", "--check")
    assert r.returncode == 2 and "cannot read config file" in r.stderr


def test_main_in_process_returns_codes(capsys):
    sys.path.insert(0, ROOT)
    import run_mindformer
    assert run_mindformer.main(["--config", SEED_41_MODEL, "--mode", "1", "--check"]) == 0
    assert run_mindformer.main(["--config", SEED_41_MODEL, "--mode", "1", "--check",
                                "--set", "training.max_norm=0"]) == 2
    err = capsys.readouterr().err
    assert "error: training.max_norm: must be > 0" in err


def test_plot_lr_text_table(tmp_path):
    out = tmp_path / "lr.txt"
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--plot-lr", str(out),
            "--set", "training.steps=50")
    assert r.returncode == 0, r.stderr
    first = out.read_text().splitlines()[0]
    assert "CosineWithWarmUpLR" in first and "total_steps=50" in first


def test_groups_table_written(tmp_path):
    out = tmp_path / "groups.txt"
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--groups", "--groups-out",
            str(out))
    assert r.returncode == 0, r.stderr
    table = out.read_text()
    assert "embedding.word_embeddings.weight" in table and table in r.stdout + "\n"


def test_warning_is_one_line_and_exit_0():
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check",
            "--set", "lr_scheduler.warmup_steps=5")
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("warning: lr_scheduler: both warmup_ratio (0.01) and "
                               "warmup_steps (5) are set; warmup_ratio wins")
    assert "warmup steps     : 10" in r.stdout


def test_strict_without_doctor_or_with_it():
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--strict", "--json")
    import importlib.util
    if importlib.util.find_spec("mindformers_core.tools.doctor") is None:
        assert r.returncode == 1 and "launch doctor" in r.stderr
    else:
        doc = json.loads(r.stdout)
        statuses = {row["status"] for row in doc["verdicts"]}
        assert statuses <= {"PASS", "WARN", "FAIL"}
        assert r.returncode == (1 if statuses & {"WARN", "FAIL"} else 0)


def test_check_of_a_config_with_only_model_exits_0_and_names_defaulted_sections(tmp_path):
    """Upstream's docs snippets and start_task example leave out training / optimizer /
    lr_scheduler: they take upstream's defaults, and no warmup is a WARN, not a FAIL."""
    p = tmp_path / "only_model.yaml"
    p.write_text("model:\n  model_type: gpt\n")
    r = run("--config", str(p), "--mode", "1", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == ("defaulted        : training, optimizer, lr_scheduler (absent from "
                        "the config: upstream MindFormers' defaults)")
    assert lines[2].startswith("  training: {steps: 1000, local_batch_size: 1, "
                               "global_batch_size: 1, max_norm: 1.0,")
    assert lines[3].startswith("  optimizer: {type: AdamW, weight_decay: 0.01,")
    assert "betas: [0.9, 0.95], eps: 1e-08" in lines[3]
    assert lines[4].startswith("  lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1e-05, "
                               "warmup_steps: 0")
    assert "[WARN] warmup" in r.stdout and "[FAIL]" not in r.stdout
    r = run("--config", str(p), "--mode", "1", "--check", "--json")
    assert json.loads(r.stdout)["defaulted_sections"] == ["training", "optimizer",
                                                          "lr_scheduler"]
    # with every section written there is no note
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check")
    assert "defaulted" not in r.stdout


def test_check_exit_codes_are_in_help():
    r = run("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert ("--check exit codes: 0 valid, and it fits (warnings allowed); 1 valid, but it will "
            "not fit or will not work (the memory planner's FAIL or a launch-doctor FAIL; a WARN "
            "too with --strict); 2 invalid (config error or missing data file)") in text


def test_no_warmup_exits_0_and_strict_makes_the_warn_exit_1():
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--json",
            "--set", "lr_scheduler.warmup_ratio=null", "--set", "lr_scheduler.warmup_steps=0")
    assert r.returncode == 0, r.stderr
    verdicts = {v["item"]: v for v in json.loads(r.stdout)["verdicts"]}
    assert verdicts["warmup"]["status"] == "WARN"
    assert verdicts["warmup"]["reason"].startswith("no warmup")
    r = run("--config", SEED_41_MODEL, "--mode", "1", "--check", "--strict",
            "--set", "lr_scheduler.warmup_ratio=null", "--set", "lr_scheduler.warmup_steps=0")
    assert r.returncode == 1
