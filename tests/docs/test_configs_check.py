"""Every config under configs/ validates with ``run_mindformer.py --check`` (in process), the
recipes the docs promise exist and say what they claim, and the CPU recipes really train."""
import glob
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

import run_mindformer
from mindformers_core.tools.data_check import missing_data_overrides
from mindformers_core.config import load_config
from mindformers_core.config.yaml_io import load_yaml_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "configs")
REQUIRED = ("training", "optimizer", "lr_scheduler")
CPU_RECIPES = ["quickstart", "markov_check", "adamw_wsd", "muon_deepseek_v3_tiny", "data_parallel"]
NPU_RECIPES = ["npu/deepseek_v3_adamw", "npu/deepseek_v3_muon"]


def _all_yaml():
    return sorted(glob.glob(os.path.join(CONFIGS, "**", "*.yaml"), recursive=True))


def _read(path):
    with open(path, encoding="utf-8") as fh:
        return load_yaml_text(fh.read())


def _full_configs():
    return [p for p in _all_yaml() if all(k in (_read(p) or {}) for k in REQUIRED)]


def _rel(path):
    return os.path.relpath(path, ROOT)


def test_recipes_exist_and_are_full_configs():
    full = {_rel(p) for p in _full_configs()}
    for name in CPU_RECIPES + NPU_RECIPES:
        assert f"configs/{name}.yaml" in full


@pytest.mark.parametrize("path", _full_configs(), ids=_rel)
def test_config_passes_check(path, capsys):
    """Every config validates; the full-size NPU recipes do not fit one CPU process, so their
    single-process --check ends with the memory planner's FAIL and exit 1."""
    swap = missing_data_overrides(path, ROOT)
    if swap:
        # production data (NPU recipes) is not on this machine: --check says so in the plan,
        # next to the memory FAIL that decides the exit code (1) ...
        code = run_mindformer.main(["--config", path, "--mode", "1", "--check"])
        out = capsys.readouterr()
        assert code == 1, out.err
        assert "data             : ERROR train_dataset.data_path: " in out.out \
            and "not found" in out.out, out.out
        assert any(line.startswith("[FAIL] memory") for line in out.out.splitlines())
        # ... and everything else in the config passes with the built-in corpus
    code = run_mindformer.main(["--config", path, "--mode", "1", "--check", *swap])
    out = capsys.readouterr()
    assert out.out.startswith(f"config OK: {path}")
    memory = [line for line in out.out.splitlines() if line.startswith("[") and " memory " in line]
    if _rel(path)[len("configs/"):-len(".yaml")] in NPU_RECIPES:
        assert code == 1, out.err
        assert memory and memory[0].startswith("[FAIL] memory") and "per rank" in memory[0]
    else:
        assert code == 0, out.err
        assert memory and memory[0].startswith("[PASS] memory")


@pytest.mark.parametrize("path", [p for p in _all_yaml() if p not in _full_configs()], ids=_rel)
def test_snippets_are_loadable_sections(path):
    """Files that are not full configs (model presets) are sections that load on a minimal run."""
    snippet = _read(path)
    assert isinstance(snippet, dict) and snippet, f"{path}: empty or not a mapping"
    base = {"training": {"steps": 10}, "optimizer": {"type": "AdamW"},
            "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3}}
    cfg = load_config({**base, **snippet})
    for section, values in snippet.items():
        loaded = cfg.to_dict()[section]
        for key, value in values.items():
            assert loaded[key] == value, f"{path}: {section}.{key}"


def test_recipes_say_what_they_claim():
    wsd = load_config(os.path.join(CONFIGS, "adamw_wsd.yaml"))
    assert (wsd.optimizer.type, wsd.lr_scheduler.type) == ("AdamW", "WarmUpStableDecayLR")
    muon = load_config(os.path.join(CONFIGS, "muon_deepseek_v3_tiny.yaml"))
    assert muon.optimizer.type == "Muon" and muon.model.model_type == "deepseek_v3"
    assert _read(os.path.join(CONFIGS, "muon_deepseek_v3_tiny.yaml"))["model"][
        "multi_latent_attention"] is True
    assert muon.lr_scheduler.learning_rate == pytest.approx(2e-2)
    dp = load_config(os.path.join(CONFIGS, "data_parallel.yaml"))
    assert dp.training.global_batch_size % (2 * dp.training.local_batch_size) == 0
    assert dp.plan(2).num_accumulation_steps * 2 * dp.training.local_batch_size == \
        dp.training.global_batch_size
    for name, opt in (("deepseek_v3_adamw", "AdamW"), ("deepseek_v3_muon", "Muon")):
        cfg = load_config(os.path.join(CONFIGS, "npu", f"{name}.yaml"))
        assert cfg.optimizer.type == opt
        assert cfg.model.params_dtype == "bfloat16"
        assert (cfg.model.hidden_size, cfg.model.num_layers, cfg.model.n_routed_experts) == \
            (7168, 61, 256)
        for workers in (1, 8, 64, 512):
            cfg.plan(workers)   # global batch divides for every power-of-two cluster size


def test_check_rejects_a_broken_recipe(tmp_path, capsys):
    """The check the recipes pass is a real one: a recipe with a typo fails with exit 2."""
    data = _read(os.path.join(CONFIGS, "adamw_wsd.yaml"))
    data["lr_scheduler"]["decay_start_ratoi"] = data["lr_scheduler"].pop("decay_start_ratio")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert run_mindformer.main(["--config", str(bad), "--mode", "1", "--check"]) == 2
    assert "lr_scheduler.decay_start_ratoi" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", CPU_RECIPES)
def test_cpu_recipe_trains(name, tmp_path):
    """Each CPU recipe runs 3 optimizer steps end to end through the CLI and logs them."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "run_mindformer.py", "--config", f"configs/{name}.yaml", "--mode", "1",
         "--set", "training.steps=3", "--set", "checkpoint.save_interleaved_steps=3",
         "--output_dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["lr"] >= 0 for r in rows)


@pytest.mark.slow
@pytest.mark.multiproc
def test_data_parallel_recipe_on_two_workers(tmp_path):
    """configs/data_parallel.yaml through the launcher on 2 workers, as docs/data_parallel.md
    says; rank 0 logs the same global batch as the single-process run plans."""
    out = tmp_path / "run"
    with socket.socket() as sock:   # a free port: other tests may run msrun at the same time
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, MASTER_PORT=str(port), LOG_DIR=str(tmp_path / "msrun_log"))
    cmd = (f"python run_mindformer.py --config configs/data_parallel.yaml --mode 1 "
           f"--set training.steps=3 --output_dir {out}")
    proc = subprocess.run(["bash", "scripts/msrun_launcher.sh", cmd, "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    with open(out / "metrics.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["global_batch_size"] == 16 for r in rows)
    # the docs promise: the same global batch on 1 worker gives the same losses
    single = tmp_path / "single"
    proc = subprocess.run([sys.executable, "run_mindformer.py", "--config",
                           "configs/data_parallel.yaml", "--mode", "1", "--set",
                           "training.steps=3", "--output_dir", str(single)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(single / "metrics.jsonl", encoding="utf-8") as fh:
        ref = [json.loads(line) for line in fh if line.strip()]
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in ref], rel=1e-4)
    assert [r["grad_norm"] for r in rows] == pytest.approx([r["grad_norm"] for r in ref], rel=1e-4)
