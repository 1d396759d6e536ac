"""Launch doctor: each checklist item flags a config that violates it, and a good config passes."""
import dataclasses
import json

import pytest

from mindformers_core.config import load_config
from mindformers_core.tools.doctor import (Verdict, count_model_params, format_doctor_report,
                                           format_doctor_table, recommended_warmup, run_doctor,
                                           token_band, verdicts_to_json)

GOOD = {
    "training": {"steps": 100000, "local_batch_size": 8, "global_batch_size": 256,
                 "max_norm": 1.0},
    "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                  "weight_decay_exclude": ["*word_embeddings*"]},
    "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 3e-4, "warmup_steps": 2000,
                     "lr_end": 3e-5},
    "model": {"model_type": "gpt", "vocab_size": 64, "hidden_size": 32, "num_layers": 1,
              "num_attention_heads": 2, "seq_length": 2048},
    "checkpoint": {"enable_save": True},
}
GOOD_MUON = {
    **GOOD,
    "optimizer": {"type": "Muon", "adamw_betas": [0.9, 0.95],
                  "weight_decay_exclude": ["*word_embeddings*"]},
    "lr_scheduler": {"type": "WarmUpStableDecayLR", "learning_rate": 2e-2, "warmup_steps": 2000,
                     "decay_start_ratio": 0.9},
    "model": {"model_type": "deepseek_v3", "seq_length": 2048},
}


def doctor(base=GOOD, overrides=(), **kw):
    cfg = load_config(base, overrides=list(overrides))
    return {v.item: v for v in run_doctor(cfg, **kw)}


@pytest.mark.parametrize("base", [GOOD, GOOD_MUON], ids=["adamw", "muon"])
def test_good_config_passes_every_item(base):
    verdicts = doctor(base)
    assert set(verdicts) == {"peak_lr", "warmup", "lr_floor", "beta2", "weight_decay",
                             "weight_decay_scope", "max_norm", "tokens_per_step",
                             "lr_batch_scaling", "grad_accumulation", "group_lr_ratios",
                             "optimizer_state", "muon_prerequisites", "loss_scale",
                             "performance_flags", "ns_steps", "memory"}
    bad = {k: v.reason for k, v in verdicts.items() if v.status != "PASS"}
    assert bad == {}


@pytest.mark.parametrize("overrides,item,status,phrase", [
    (["lr_scheduler.learning_rate=1e-5", "lr_scheduler.lr_end=1e-6"], "peak_lr", "WARN", "below the usual AdamW"),
    (["lr_scheduler.warmup_steps=100"], "warmup", "WARN", "max(1000, 2% of 100000 steps) = 2000"),
    (["lr_scheduler.warmup_steps=0"], "warmup", "WARN", "no warmup"),
    (["lr_scheduler.lr_end=0.0"], "lr_floor", "WARN", "0.0% of the peak"),
    (["lr_scheduler.num_cycles=1.0"], "lr_floor", "WARN", "does not finish"),
    (["optimizer.betas=[0.9,0.999]"], "beta2", "WARN", "betas[1] = 0.999"),
    (["optimizer.weight_decay=0.01"], "weight_decay", "WARN", "0.01 is weak"),
    (["optimizer.weight_decay=0.0"], "weight_decay", "WARN", "disabled"),
    (["optimizer.decoupled_weight_decay=False"], "weight_decay", "WARN", "coupled L2"),
    (["optimizer.weight_decay_exclude=null"], "weight_decay_scope", "WARN",
     "word embedding is decayed"),
    (["optimizer.weight_decay_include=['*norm*']"], "weight_decay_scope", "WARN",
     "1-D/bias parameters are decayed"),
    (["optimizer.rmsnorm_weight_decay_mult=1.0"], "weight_decay_scope", "WARN",
     "1-D/bias parameters are decayed"),
    (["training.max_norm=null"], "max_norm", "WARN", "disables gradient clipping"),
    (["training.max_norm=10.0"], "max_norm", "WARN", "rarely clips"),
    (["training.global_batch_size=8"], "tokens_per_step", "WARN", "below the band"),
    (["optimizer.param_overrides=[{name: '*output_layer*', lr_mult: 0.0}]"], "group_lr_ratios",
     "WARN", "never train"),
    (["optimizer.param_overrides=[{name: '*output_layer*', lr_mult: 20.0}]"], "group_lr_ratios",
     "WARN", "> 10x the base lr"),
    (["checkpoint.no_save_optim=True"], "optimizer_state", "WARN", "lack the optimizer state"),
    (["checkpoint.load_path=/tmp/x", "checkpoint.no_load_optim=True"], "optimizer_state", "WARN",
     "Adam moments restart"),
])
def test_each_violation_is_flagged(overrides, item, status, phrase):
    v = doctor(GOOD, overrides)[item]
    assert v.status == status, v.reason
    assert phrase in v.reason
    assert v.suggestion


def test_seed_4_1_recipe_gets_its_warmup_warning():
    """The guide's AdamW example: warmup_ratio 0.01 of 1000 steps = 10 warmup steps."""
    v = doctor(load_config("tests/fixtures/seed_4_1_adamw.yaml").to_dict())["warmup"]
    assert v.status == "WARN"
    assert "warmup 10 steps < max(1000, 2% of 1000 steps) = 1000" in v.reason
    assert v.suggestion.startswith("warmup_steps: 1000")


def test_fine_tuning_allows_short_warmup_and_beta2_0999():
    verdicts = doctor(GOOD, ["lr_scheduler.warmup_steps=100", "optimizer.betas=[0.9,0.999]"],
                      pretraining=False)
    assert verdicts["warmup"].status == "PASS"
    assert verdicts["beta2"].status == "PASS"


@pytest.mark.parametrize("opt", ["AdamW", "Muon"])
@pytest.mark.parametrize("steps", [999, 1000, 100000])
def test_no_warmup_is_a_warning_not_a_failure(steps, opt):
    """FAIL means "this run will not work or will not fit"; a run without warmup works (every
    upstream PyNative YAML has none), so it is advice at any length, for any optimizer."""
    base = GOOD if opt == "AdamW" else GOOD_MUON
    v = doctor(base, ["lr_scheduler.warmup_steps=0", f"training.steps={steps}"])["warmup"]
    assert v.status == "WARN" and v.reason.startswith("no warmup"), v.reason
    assert v.suggestion.startswith(f"warmup_steps: {recommended_warmup(steps)}")


def test_recommended_warmup():
    assert recommended_warmup(1000) == 1000
    assert recommended_warmup(100000) == 2000
    assert recommended_warmup(38147) == 1000          # 2% = 763 < 1000
    assert recommended_warmup(50001) == 1001


@pytest.mark.parametrize("ref_batch,ref_lr,status,phrase", [
    (64, 1.5e-4, "PASS", "wants 0.0003"),            # sqrt: 1.5e-4 * sqrt(256/64) = 3e-4
    (64, 7.5e-5, "WARN", "that is the linear rule"),  # linear from 7.5e-5 gives 3e-4
    (64, 3e-4, "WARN", "not rescaled"),               # sqrt wants 6e-4
    (16, 3e-5, "WARN", "wants 0.00012"),              # 4x off: advice, the run works
    (16, 3e-5, "WARN", "(more than 2x off)"),
    (-16, 3e-5, "WARN", "no comparison: "),           # cannot be compared: still not a FAIL
    (None, 3e-4, "WARN", "give both"),
])
def test_lr_batch_scaling(ref_batch, ref_lr, status, phrase):
    v = doctor(reference_batch=ref_batch, reference_lr=ref_lr)["lr_batch_scaling"]
    assert v.status == status, v.reason
    assert phrase in v.reason


def test_lr_batch_scaling_uses_linear_rule_for_sgd():
    base = {**GOOD, "optimizer": {"type": "SGD", "weight_decay": 0.1,
                                  "weight_decay_exclude": ["*word_embeddings*"]}}
    v = doctor(base, reference_batch=64, reference_lr=7.5e-5)["lr_batch_scaling"]
    assert v.status == "PASS" and "linear rule, SGD" in v.reason


def test_grad_accumulation_arithmetic_and_other_world_sizes():
    v = doctor()["grad_accumulation"]
    assert v.status == "PASS"
    assert "global_batch_size 256 = local_batch_size 8 x data_parallel 1 x accumulation 32" \
        in v.reason
    v = doctor(world_size=4)["grad_accumulation"]
    assert v.status == "PASS" and "data_parallel 4 x accumulation 8" in v.reason
    v = doctor(world_size=3)["grad_accumulation"]
    assert v.status == "FAIL" and "must be divisible by data_parallel(3)" in v.reason


def test_muon_items():
    v = doctor(GOOD_MUON, ["optimizer.qk_clip_enabled=False"])["muon_prerequisites"]
    assert v.status == "WARN" and "QK-Clip disabled" in v.reason
    # a Muon config on a model without MLA never loads (ConfigError); the doctor still
    # reports it when handed such a config object
    cfg = load_config(GOOD_MUON)
    no_mla = dataclasses.replace(cfg, model=load_config(GOOD).model)
    v = {x.item: x for x in run_doctor(no_mla, inspect_model=False)}["muon_prerequisites"]
    assert v.status == "FAIL" and "without Multi-Latent Attention" in v.reason
    v = doctor(GOOD_MUON, ["optimizer.muon_scale_mode=shape_scaling"])["group_lr_ratios"]
    assert v.status == "WARN" and v.suggestion == "optimizer.adamw_lr_mult: 0.15"


def test_mup_groups_are_reported():
    v = doctor(GOOD, ["optimizer.mup={base_hidden_size: 8}"])["group_lr_ratios"]
    assert v.status == "PASS"
    assert "x0.25" in v.reason and "muP width_mult 4" in v.reason


def test_inspect_model_false_skips_group_items_and_accepts_a_path():
    items = [v.item for v in run_doctor("tests/fixtures/seed_4_1_with_model.yaml",
                                        inspect_model=False)]
    assert "weight_decay_scope" not in items and "group_lr_ratios" not in items
    assert items[:2] == ["peak_lr", "warmup"]


@pytest.mark.parametrize("model", [
    {"model_type": "gpt", "vocab_size": 50, "hidden_size": 32, "num_layers": 3,
     "num_attention_heads": 4, "num_query_groups": 2, "ffn_hidden_size": 72},
    {"model_type": "gpt", "hidden_size": 32, "num_attention_heads": 2,
     "tie_word_embeddings": True},
    {"model_type": "deepseek_v3"},
    {"model_type": "deepseek_v3", "q_lora_rank": None, "n_shared_experts": 0, "num_layers": 3},
])
def test_count_model_params_matches_the_built_model(model):
    from mindformers_core.models import build_model
    cfg = load_config({**GOOD, "model": model}).model
    built = build_model(cfg, seed=0)
    assert count_model_params(cfg) == sum(int(p.size) for p in built.trainable_params())


def test_token_band():
    assert token_band(1e8) == (65_536, 1_048_576)
    assert token_band(7e9) == (524_288, 4_194_304)
    assert token_band(7e11)[1] == 16_777_216


def test_verdict_json_and_table():
    verdicts = run_doctor(load_config(GOOD), inspect_model=False)
    rows = verdicts_to_json(verdicts)
    assert json.loads(json.dumps(rows)) == rows
    assert set(rows[0]) == {"item", "status", "reason", "suggestion"}
    assert verdicts[0].get("status") == verdicts[0].status == "PASS"
    table = format_doctor_table(verdicts)
    assert table.splitlines()[-1] == f"{len(verdicts)} PASS, 0 WARN, 0 FAIL"
    report = format_doctor_report(load_config(GOOD), verdicts)
    assert "lr at key steps:" in report and "warmup_end" in report
    with pytest.raises(ValueError, match="status must be one of"):
        Verdict("x", "OK", "y")


def test_doctor_cli_flags():
    import argparse
    from mindformers_core.tools.doctor import add_doctor_arguments, doctor_from_args
    parser = argparse.ArgumentParser()
    add_doctor_arguments(parser)
    args = parser.parse_args(["--reference-batch", "64", "--reference-lr", "7.5e-5",
                              "--fine-tuning"])
    cfg = load_config(GOOD, overrides=["lr_scheduler.warmup_steps=100"])
    verdicts = {v.item: v for v in doctor_from_args(cfg, args)}
    assert verdicts["lr_batch_scaling"].status == "WARN"
    assert verdicts["warmup"].status == "PASS"          # --fine-tuning
    plain = {v.item: v for v in doctor_from_args(cfg, argparse.Namespace())}
    assert plain["warmup"].status == "WARN" and plain["lr_batch_scaling"].status == "PASS"


def test_run_mindformer_check_strict(tmp_path, capsys):
    """--check exits 0 for a valid config; --strict exits 1 on the seed 4.1 recipe's WARNs and
    0 on a config that passes every item."""
    import yaml
    import run_mindformer
    seed = "tests/fixtures/seed_4_1_with_model.yaml"
    assert run_mindformer.main(["--config", seed, "--mode", "1", "--check"]) == 0
    capsys.readouterr()
    assert run_mindformer.main(["--config", seed, "--mode", "1", "--check", "--strict",
                                "--json"]) == 1
    rows = {r["item"]: r for r in json.loads(capsys.readouterr().out)["verdicts"]}
    assert rows["warmup"]["status"] == "WARN"
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(GOOD))
    assert run_mindformer.main(["--config", str(good), "--mode", "1", "--check",
                                "--strict"]) == 0


#: the WARN text of each upstream performance flag that changes nothing here
PERFORMANCE_WARNS = {
    "enable_loss_parallel=True": (
        "parallelism.enable_loss_parallel: True changes nothing here: the vocab-parallel loss is "
        "what tensor parallel already does (the output layer's logits stay split over the "
        "tensor-parallel ranks and the cross-entropy reduces over them, "
        "models/sequence_parallel.py vocab_parallel_token_losses); with tensor_parallel 1 "
        "there is no vocabulary split"),
    "enable_mc2=True": (
        "parallelism.enable_mc2: True changes nothing here: MC2 fuses the tensor-parallel matmul "
        "with its communication into one Ascend kernel; this backend runs the matmul and the "
        "collective as separate ops (the same math)"),
    "pipeline_parallel_overlap_p2p=True": (
        "parallelism.pipeline_parallel_overlap_p2p: True changes nothing here: the pipeline's "
        "stage-to-stage sends and receives are not overlapped with compute on this backend "
        "(the same math, the same schedule)"),
    "pipeline_parallel_overlap_b_f=True": (
        "parallelism.pipeline_parallel_overlap_b_f: True changes nothing here: the pipeline "
        "schedule (1F1B or interleaved 1F1B) runs one micro-batch's backward and the next "
        "one's forward one after the other, not overlapped (the same math)"),
    "dense_fsdp_shard_size=8": (
        "parallelism.dense_fsdp_shard_size: 8 changes nothing here: dense parameters are sharded "
        "over the data_parallel_shard ranks that data_parallel_shard_strategy names, with no "
        "separate dense shard group"),
}


@pytest.mark.parametrize("flag", sorted(PERFORMANCE_WARNS))
def test_each_performance_flag_is_accepted_with_a_warn_saying_it_changes_nothing(flag):
    cfg = load_config(GOOD, overrides=[f"parallelism.{flag}"])
    v = {x.item: x for x in run_doctor(cfg, inspect_model=False)}["performance_flags"]
    assert v.status == "WARN" and v.reason == PERFORMANCE_WARNS[flag]
    # its off value is the default and passes
    off = {x.item: x for x in run_doctor(load_config(GOOD), inspect_model=False)}
    assert off["performance_flags"].status == "PASS"


def test_all_performance_flags_together_one_warn_listing_each():
    cfg = load_config(GOOD, overrides=[f"parallelism.{f}" for f in PERFORMANCE_WARNS])
    v = {x.item: x for x in run_doctor(cfg, inspect_model=False)}["performance_flags"]
    assert v.reason == "; ".join(PERFORMANCE_WARNS[f] for f in PERFORMANCE_WARNS)


@pytest.mark.parametrize("flag,msg", [
    ("enable_mc2=1", r"^parallelism\.enable_mc2: expected a bool \(True/False\), got int"),
    ("dense_fsdp_shard_size=0", r"^parallelism\.dense_fsdp_shard_size: must be null or >= 1, "
                                r"got 0"),
])
def test_performance_flags_keep_their_type_checks(flag, msg):
    from mindformers_core.config import ConfigError
    with pytest.raises(ConfigError, match=msg):
        load_config(GOOD, overrides=[f"parallelism.{flag}"])
