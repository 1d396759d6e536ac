"""tools/plan_layout.py and tools/layout_search.py: enumeration through check_layout and the
config's rules, JSON output, uneven pipeline splits, refused flags, --check's "these fit", and
the 671B preset on paper."""
import json
import os
import subprocess
import sys

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.layout import check_layout
from mindformers_core.core.device_profiles import get_profile
from mindformers_core.core.parallel_dims import make_mesh
from mindformers_core.core.pipeline_split import StageSplit
from mindformers_core.tools import plan_layout
from mindformers_core.tools.layout_search import (Candidate, config_check, evaluate,
                                                  layers_per_stage_lists, schedule_bubble,
                                                  search)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT = os.path.join(ROOT, "configs", "data_parallel.yaml")
BIG = ["model.hidden_size=512", "model.num_layers=4", "model.seq_length=512",
       "model.vocab_size=8192"]
DSV3 = os.path.join(ROOT, "configs", "npu", "deepseek_v3_muon.yaml")


def _run(capsys, *argv):
    code = plan_layout.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_one_document_best_first(capsys):
    code, out, err = _run(capsys, "--config", GPT, "--world", "4", "--device", "cpu",
                          "--device-memory", "4GiB", "--json", "--vary",
                          "micro_batch,recompute")
    assert code == 0, err
    doc = json.loads(out)   # the whole stdout is one JSON document
    assert list(doc) == ["layouts"] and doc["layouts"]
    times = [e["step_time_s"] for e in doc["layouts"]]
    assert times == sorted(times)
    keys = {"tensor_parallel", "pipeline_parallel", "expert_parallel", "context_parallel",
            "data_parallel_shard", "data_parallel_shard_strategy", "sequence_parallel",
            "pipeline_parallel_interleave_num", "pipeline_parallel_layers_per_stage"}
    for e in doc["layouts"]:
        assert set(e["parallelism"]) == keys
        assert e["recompute"] in ("none", "selective", "full")
        assert e["memory_bytes_per_rank"] <= 4 * 2 ** 30
        # every proposed layout is accepted by check_layout (and by the config: loaded below)
        par = e["parallelism"]
        check_layout(make_mesh(4, tp=par["tensor_parallel"], pp=par["pipeline_parallel"],
                               ep=par["expert_parallel"], cp=par["context_parallel"],
                               vpp=par["pipeline_parallel_interleave_num"],
                               shard_strategy=par["data_parallel_shard_strategy"]))


def test_table_yaml_and_why(capsys):
    code, out, err = _run(capsys, "--config", GPT, "--world", "2", "--device", "cpu",
                          "--device-memory", "8GiB", "--top", "3")
    assert code == 0, err
    assert "the 3 fastest that fit" in out and "best: " in out and "slower" in out
    yaml_part = out[out.index("parallelism:"):]
    assert "recompute:" in yaml_part and "local_batch_size: 4" in yaml_part
    # the pasted YAML loads as the config's sections
    import yaml
    sections = yaml.safe_load(yaml_part)
    cfg = load_config(GPT, overrides=[f"parallelism.{k}={json.dumps(v)}"
                                      for k, v in sections["parallelism"].items()])
    assert cfg.parallelism.tensor_parallel == sections["parallelism"]["tensor_parallel"]


def test_memory_forces_the_layout(capsys):
    # on 4 CPU workers with a cap below plain data parallelism only tp (or FSDP) fits
    code, out, err = _run(capsys, "--config", GPT, "--set", "model.hidden_size=256", "--set",
                          "model.seq_length=256", "--set", "model.vocab_size=4096", "--set",
                          "model.num_attention_heads=8", "--set", "model.num_layers=4",
                          "--world", "4", "--device", "cpu", "--device-memory", "680MiB")
    assert code == 0, err
    assert "tp4" in out.splitlines()[3]
    assert "memory forces it: tp1 pp1 ep1 cp1 dp4" in out


def test_uneven_split_lists():
    lists = layers_per_stage_lists(61, 16, 1)
    assert len(lists) == 2
    for lps in lists:
        split = StageSplit.build(61, 16, 1, list(lps))
        sizes = sorted(len(split.stage_layers(s)) for s in range(16))
        assert sizes == [3] * 3 + [4] * 13
    assert StageSplit.build(61, 16, 1, list(lists[0])).stage_layers(0) == [0, 1, 2, 3]
    assert StageSplit.build(61, 16, 1, list(lists[1])).stage_layers(0) == [0, 1, 2]
    inter = layers_per_stage_lists(10, 2, 2)   # 10 layers on 4 virtual stages: 3, 3, 2, 2
    assert StageSplit.build(10, 2, 2, list(inter[0])).stage_layers(0) == [0, 1, 2, 6, 7]
    assert layers_per_stage_lists(8, 2, 2) == [None]


def test_uneven_split_proposed_and_loaded():
    # 5 layers on 2 pipeline stages: the config refuses "auto", the advisor writes the list
    cfg = load_config(GPT, overrides=["model.num_layers=5"])
    found, _ = search(cfg, 2, get_profile("cpu"), 64 * 2 ** 30, source=GPT,
                      overrides=["model.num_layers=5"], top=50)
    pp = [e for e in found if e.candidate.pp == 2]
    assert pp and all(e.checked for e in pp)
    assert {tuple(e.candidate.layers_per_stage) for e in pp if e.candidate.vpp == 1} <= \
        {("0-2", "3-4"), ("0-1", "2-4")}


def test_config_rules_refuse_what_check_layout_lets_through():
    # tp 8 passes check_layout on 8 ranks, but the model has 4 heads: the config refuses it
    cfg = load_config(GPT)
    cand = Candidate(8, 1, 1, 1, 1, 1, "optim", False, None, "none", 4)
    assert evaluate(cfg, cand, 8, get_profile("cpu")) is not None
    assert isinstance(config_check(GPT, [], cand, 8), ConfigError)
    found, _ = search(cfg, 8, get_profile("cpu"), 64 * 2 ** 30, source=GPT, top=100)
    assert found and all(e.candidate.tp <= 4 for e in found)


def test_untimed_unfit_layouts_give_the_same_fitting_layouts():
    """``time_unfit=False`` (--check's "these fit" and the advisor's hints): the layouts that
    do not fit are not timed, and the fitting ones, their order and costs are the full
    search's; an interleaved schedule the pipeline refuses is still refused."""
    cfg = load_config(GPT, overrides=BIG + ["training.global_batch_size=16"])
    profile = get_profile("cpu")
    everything, _ = search(cfg, 8, profile, 2.0 ** 62, vary=("recompute",), top=10 ** 6)
    limit = sorted(e.memory_bytes for e in everything)[len(everything) // 2]
    full, facts = search(cfg, 8, profile, limit, vary=("recompute",), top=10 ** 6)
    lazy, _ = search(cfg, 8, profile, limit, vary=("recompute",), top=10 ** 6,
                     time_unfit=False)
    assert 0 < len(full) < len(everything) and "faster_unfit" in facts
    assert [(e.candidate, e.memory_bytes, e.cost) for e in lazy] == \
        [(e.candidate, e.memory_bytes, e.cost) for e in full]
    big = Candidate(1, 1, 2, 1, 1, 4, "optim", False, None, "none", 1)
    assert evaluate(cfg, big, 8, profile, time_above=0).cost is None
    assert evaluate(cfg, big, 8, profile).cost is not None
    odd = Candidate(1, 1, 2, 2, 1, 4, "optim", False, None, "none", 1)   # 4 micro: fine
    assert evaluate(cfg, odd, 8, profile, time_above=0) is not None
    bad = load_config(GPT, overrides=BIG + ["training.global_batch_size=12"])   # 3 micro
    assert evaluate(bad, odd, 8, profile, time_above=0) is None
    assert evaluate(bad, odd, 8, profile) is None


def test_bubble_is_the_simulated_schedule():
    # 1F1B: (pp - 1) / (M + pp - 1); interleaved: (pp - 1) / (vpp M + pp - 1)
    assert schedule_bubble(4, 1, 8) == pytest.approx(3 / 11)
    assert schedule_bubble(4, 2, 8) == pytest.approx(3 / 19)
    assert schedule_bubble(1, 1, 8) == 0.0


def test_refused_unknown_device(capsys):
    code, _, err = _run(capsys, "--config", GPT, "--world", "2", "--device", "tpu9")
    assert code == 2
    assert "error: --device: unknown device 'tpu9'; known: ascend910b, cpu, gpu80g" in err


def test_refused_memory_without_unit(capsys):
    code, _, err = _run(capsys, "--config", GPT, "--world", "2", "--device-memory", "64")
    assert code == 2
    assert "error: --device-memory: expected a positive size with a unit" in err
    assert "got '64'" in err


def test_refused_vary(capsys):
    code, _, err = _run(capsys, "--config", GPT, "--world", "2", "--vary", "tp")
    assert code == 2 and "error: --vary: expected a comma list of micro_batch, recompute" in err


def test_refused_no_fit_says_what_would(capsys):
    args = ["--config", GPT] + [a for o in BIG for a in ("--set", o)]
    code, _, err = _run(capsys, *args, "--world", "2", "--device", "cpu",
                        "--device-memory", "1000MiB")
    assert code == 2
    assert "error: --world: no layout fits on 2 devices of 1000.00 MiB: the smallest" in err
    assert ("would fit: more devices (--world 4); recompute (--vary recompute); a smaller "
            "micro-batch (--vary micro_batch)") in err
    code, _, err = _run(capsys, *args, "--world", "2", "--device", "cpu",
                        "--device-memory", "100MiB")
    assert code == 2 and "would fit: nothing tried" in err and "a larger --device-memory" in err


def test_check_prints_these_fit(tmp_path):
    cfg = tmp_path / "big.yaml"
    text = open(GPT).read().replace("train_dataset:", "context:\n  device_target: Ascend\n"
                                    "  max_device_memory: 4GB\n\ntrain_dataset:")
    cfg.write_text(text)
    env = dict(os.environ, MS_WORKER_NUM="4")
    r = subprocess.run([sys.executable, "run_mindformer.py", "--config", str(cfg), "--mode", "1",
                        "--check"]
                       + [a for o in BIG + ["model.num_layers=8", "model.seq_length=2048"]
                          for a in ("--set", o)],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "these fit: " in r.stdout
    line = next(l for l in r.stdout.splitlines() if l.startswith("these fit: "))
    # the config's layout needs 214% of 4 GB; recompute or a smaller micro-batch fits
    assert "recompute full" in line and "micro-batch 1" in line and "plan_layout" in line


PP_EP_DP = ("check_layout does not accept pp x ep x dp (pipeline x expert x data parallel) "
            "yet")
#: docs/memory.md's DeepSeek-V3 run: global batch 4096 (32 micro-batches per dp rank)
DSV3_SET = ["training.global_batch_size=4096"]


def _deepseek_layout_or_xfail():
    try:
        check_layout(make_mesh(2048, pp=16, ep=64, dp_shard=128))
    except ConfigError as exc:
        pytest.xfail(f"{PP_EP_DP}: {exc}")


@pytest.mark.slow
def test_671b_on_2048_gpus_deepseeks_layout():
    """DeepSeek's published layout: pp16 x ep64 x ZeRO-1 dp128, 2048 devices of 80 GiB:
    accepted and fits (strict once check_layout composes pp x ep x dp); its rank: below."""
    _deepseek_layout_or_xfail()
    cfg = load_config(DSV3, overrides=DSV3_SET)
    profile = get_profile("gpu80g")
    layouts = layers_per_stage_lists(61, 16, 1)
    ds = [evaluate(cfg, Candidate(1, 1, 16, 1, 64, 128, "optim", False, lps, "full", 1), 2048,
                   profile) for lps in layouts]
    assert all(e is not None for e in ds)                       # accepted
    assert min(e.memory_bytes for e in ds) <= 80 * 2 ** 30      # fits
    assert not isinstance(config_check(DSV3, DSV3_SET, ds[0].candidate, 2048), ConfigError)
    found, _ = search(cfg, 2048, profile, 80 * 2 ** 30, source=DSV3, overrides=DSV3_SET,
                      vary=["recompute"], top=5)
    assert found
    if not any(e.candidate.pp == 16 and e.candidate.ep == 64 and e.candidate.dp == 128 and
               e.candidate.tp == 1 and e.candidate.strategy == "optim" for e in found):
        # on paper (check_layout bypassed): 21.9 s/step against 10.3 s for pp16x3 ep8 cp2:
        # ep64 spans 8 nodes and its all-to-alls are exposed (DeepSeek hides them with
        # DualPipe; this package and its cost model overlap nothing: docs/plan_layout.md)
        pytest.xfail("the cost model ranks DeepSeek's layout below the top 5: its ep64 "
                     "all-to-all crosses nodes and nothing overlaps it: "
                     + "; ".join(e.candidate.describe() for e in found))


@pytest.mark.slow
def test_671b_on_64gib_ascend_says_what_forces_it(capsys):
    _deepseek_layout_or_xfail()
    code, out, err = _run(capsys, "--config", DSV3, "--set", DSV3_SET[0], "--world", "2048",
                          "--device", "ascend910b", "--vary", "recompute")
    assert code == 0, err
    assert "memory forces it" in out


@pytest.mark.parametrize("flag, value, text", [
    ("--world", "0", "error: --world: must be >= 1, got 0"),
    ("--top", "0", "error: --top: must be >= 1, got 0"),
])
def test_refused_counts(capsys, flag, value, text):
    argv = {"--world": "2", "--top": "3", flag: value}
    code, _, err = _run(capsys, "--config", GPT, "--device-memory", "4GiB",
                        *[a for k, v in argv.items() for a in (k, v)])
    assert code == 2 and text in err


def test_calibration_file(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = _run(capsys, "--config", GPT, "--world", "2", "--device", "cpu",
                        "--device-memory", "4GiB", "--calibration", str(bad))
    assert code == 2 and f"error: --calibration: cannot read {str(bad)!r}" in err
    # a 10x slower matmul makes every predicted step slower
    base = json.loads(_run(capsys, "--config", GPT, "--world", "2", "--device", "cpu",
                           "--device-memory", "4GiB", "--json")[1])["layouts"][0]
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"matmul_flops": 8e8, "op_overhead_s": 4e-4}))
    code, out, _ = _run(capsys, "--config", GPT, "--world", "2", "--device", "cpu",
                        "--device-memory", "4GiB", "--json", "--calibration", str(slow))
    assert code == 0 and json.loads(out)["layouts"][0]["step_time_s"] > base["step_time_s"]
