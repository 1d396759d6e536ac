"""The memory planner in ``run_mindformer.py --check`` (text and --json, exit code) and in the
plan printed at the start of a run."""
import json
import os

import run_mindformer
from mindformers_core.tools.data_check import missing_data_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NPU = os.path.join(ROOT, "configs", "npu", "deepseek_v3_adamw.yaml")
QUICK = os.path.join(ROOT, "configs", "quickstart.yaml")
#: the NPU recipe's production data is not on this machine: the built-in corpus stands in
NO_DATA = missing_data_overrides(NPU, ROOT)


def test_check_of_the_671b_preset_on_one_process_fails(capsys):
    code = run_mindformer.main(["--config", NPU, "--mode", "1", "--check",
                                "--set", "context.device_target=CPU", *NO_DATA])
    out = capsys.readouterr().out
    assert code == 1
    assert "memory plan (per rank, dp 1 (state sharded over 1, optim), tp 1, pp 1" in out
    row = next(line for line in out.splitlines() if line.startswith("[FAIL] memory"))
    assert "per rank" in row and "exceeds the device" in row and "(host RAM (CPU))" in row
    assert "biggest item optimizer state" in row


def test_check_json_carries_the_memory_plan(capsys):
    code = run_mindformer.main(["--config", NPU, "--mode", "1", "--check", "--json",
                                "--set", "context.device_target=Ascend", *NO_DATA])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    mem = data["memory"]
    assert mem["limit"] == 59 * 1024 ** 3 and mem["total"] > mem["limit"]
    assert mem["total"] == sum(mem["items"].values())
    assert round(mem["total_params"] / 1e9) == 671
    verdict = next(v for v in data["verdicts"] if v["item"] == "memory")
    assert verdict["status"] == "FAIL" and "context.max_device_memory 59GB" in verdict["reason"]


def test_check_of_a_cpu_recipe_passes(capsys):
    assert run_mindformer.main(["--config", QUICK, "--mode", "1", "--check"]) == 0
    out = capsys.readouterr().out
    assert "memory plan (per rank" in out and "[PASS] memory" in out


def test_start_of_run_prints_the_memory_plan(tmp_path, capsys):
    code = run_mindformer.main(["--config", QUICK, "--mode", "1", "--output_dir",
                                str(tmp_path), "--set", "training.steps=1",
                                "--set", "checkpoint.enable_save=False"])
    out = capsys.readouterr().out
    assert code == 0
    assert "memory plan (per rank, dp 1" in out and "host RAM (CPU)" in out
