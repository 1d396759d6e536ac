"""load_config: sections, overrides, cross-field rules, to_dict round trip, plan()."""
import os
import subprocess
import sys
import warnings

import pytest

from mindformers_core.config import ConfigError, RunConfig, apply_overrides, load_config

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
SEED_41 = os.path.join(FIX, "seed_4_1_adamw.yaml")
SEED_42 = os.path.join(FIX, "seed_4_2_muon_deepseek.yaml")


def base(**sections):
    d = {"training": {"steps": 100, "local_batch_size": 2, "global_batch_size": 4},
         "optimizer": {"type": "AdamW"},
         "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 10}}
    d.update(sections)
    return d


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    # data_parallel comes from msrun's environment; keep tests independent of the caller's
    for var in ("MS_ROLE", "MS_WORKER_NUM", "RANK_ID"):
        monkeypatch.delenv(var, raising=False)


# ---- the seed's complete YAMLs ----------------------------------------------------------------
def test_seed_4_1_loads_with_documented_values():
    cfg = load_config(SEED_41)
    assert isinstance(cfg, RunConfig)
    t, o, s = cfg.training, cfg.optimizer, cfg.lr_scheduler
    assert (t.steps, t.local_batch_size, t.global_batch_size, t.max_norm, t.seed) == \
        (1000, 2, 4, 1.0, 42)
    assert o.type == "AdamW" and o.betas == [0.9, 0.95] and o.eps == 1e-8
    assert o.weight_decay == 0.01 and o.weight_decay_exclude == ["*norm*", "*bias*"]
    assert s.type == "CosineWithWarmUpLR" and s.learning_rate == 1e-5
    assert s.warmup_ratio == 0.01 and s.lr_end == 0.0 and s.warmup_lr_init == 0.0
    plan = cfg.plan()
    # int(1000 * 0.01) = 10 warmup steps; 4 // (2 * 1) = 2 micro-batches per step
    assert plan.total_steps == 1000 and plan.warmup_steps == 10
    assert plan.data_parallel == 1 and plan.num_accumulation_steps == 2
    assert plan.tokens_per_step == 4 * cfg.model.seq_length
    # the other sections take their CPU-sized defaults
    assert cfg.model.model_type == "gpt" and cfg.parallelism.tensor_parallel == 1


def test_seed_4_2_loads_with_documented_values():
    cfg = load_config(SEED_42)
    o = cfg.optimizer
    assert o.type == "Muon" and o.weight_decay == 0.1 and o.eps == 1e-7
    assert o.ns_schedule() == [(3.4445, -4.7750, 2.0315)] * 5
    assert o.qk_clip_threshold == 100.0 and o.comm_strategy == "allgather"
    assert cfg.lr_scheduler.learning_rate == 2e-2
    plan = cfg.plan()
    assert plan.warmup_steps == 0 and plan.num_accumulation_steps == 1


def test_yaml_1e_minus_5_is_a_float(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("training: {steps: 10}\noptimizer: {type: AdamW, eps: 1e-8}\n"
                 "lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1e-5, warmup_steps: 0}\n")
    cfg = load_config(str(p))
    assert cfg.optimizer.eps == 1e-8 and cfg.lr_scheduler.learning_rate == 1e-5


# ---- sections -----------------------------------------------------------------------------
def test_unknown_section_suggests_closest():
    d = base()
    d["optimiser"] = d.pop("optimizer")
    with pytest.raises(ConfigError, match=r"^optimiser: unknown section; .*did you mean "
                                          r"'optimizer'\?"):
        load_config(d)


#: upstream MindFormers 2.1's TrainConfig defaults (reference file §1.2-1.4); lr_scheduler has
#: no upstream default type, ours is config/lr_scheduler.py's ABSENT_LR_SCHEDULER
UPSTREAM_DEFAULTS = {
    "training": {"steps": 1000, "local_batch_size": 1, "global_batch_size": 1, "max_norm": 1.0,
                 "use_skip_step_on_nan": False, "max_consecutive_skipped_steps": 0,
                 "seed": 42, "deterministic": False, "rampup_batch_size": None},
    "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01,
                  "weight_decay_include": None, "weight_decay_exclude": None},
    "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-5, "warmup_steps": 0},
}


@pytest.mark.parametrize("name", ["training", "optimizer", "lr_scheduler"])
def test_absent_section_takes_upstream_defaults(name):
    d = base()
    del d[name]
    cfg = load_config(d)
    written = getattr(cfg, name).to_dict()
    assert {k: written[k] for k in UPSTREAM_DEFAULTS[name]} == UPSTREAM_DEFAULTS[name]
    assert cfg.defaulted_sections() == (name,)
    # a null section is absent too; the other sections stay as written
    assert load_config({**d, name: None}).defaulted_sections() == (name,)
    assert cfg.training.steps == (1000 if name == "training" else 100)


def test_only_model_section_defaults_the_three_and_round_trips():
    cfg = load_config({"model": {"model_type": "gpt"}})
    assert cfg.defaulted_sections() == ("training", "optimizer", "lr_scheduler")
    assert cfg.plan().warmup_steps == 0 and cfg.build_lr_scheduler().lr_at(0) == 1e-5
    again = load_config(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict() and again.defaulted_sections() == ()
    assert RunConfig().to_dict() == load_config({}).to_dict()
    note = cfg.format_defaulted_sections()
    assert note.splitlines()[0] == ("defaulted        : training, optimizer, lr_scheduler "
                                    "(absent from the config: upstream MindFormers' defaults)")
    assert "  lr_scheduler: {type: ConstantWarmUpLR, learning_rate: 1e-05, warmup_steps: 0" \
        in note
    assert load_config(base()).format_defaulted_sections() == ""


def test_empty_file_is_every_default(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("")
    cfg = load_config(str(p))
    assert cfg.defaulted_sections() == ("training", "optimizer", "lr_scheduler")
    assert cfg.to_dict() == load_config({}).to_dict()


@pytest.mark.parametrize("section,key,msg", [
    ("training", "stepz", r"^training\.stepz: unknown key"),
    ("optimizer", "betaz", r"^optimizer\.betaz: unknown key for type AdamW"),
    ("lr_scheduler", "type", r"^lr_scheduler\.type: required"),
])
def test_written_sections_are_still_strict(section, key, msg):
    """Defaults fill absent sections only: a written section keeps its required keys and
    unknown keys stay errors."""
    written = {"type": "AdamW"} if section == "optimizer" else {}
    if key != "type":
        written[key] = 1
    else:
        written["learning_rate"] = 1e-4   # a written lr_scheduler without its type
    with pytest.raises(ConfigError, match=msg):
        load_config({section: written})


def test_top_level_not_a_mapping(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"^config: expected a mapping of sections, got list"):
        load_config(str(p))


def test_missing_file():
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read config file"):
        load_config("/nonexistent/nope.yaml")


def test_invalid_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("training:\n  steps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid YAML at line \d+"):
        load_config(str(p))


def test_unknown_key_in_sections():
    with pytest.raises(ConfigError, match=r"^model\.hiden_size: unknown key; .*'hidden_size'"):
        load_config(base(model={"hiden_size": 32}))
    with pytest.raises(ConfigError, match=r"^parallelism\.data_parallel: unknown key"):
        load_config(base(parallelism={"data_parallel": 2}))


# ---- cross-field rules --------------------------------------------------------------------
def test_total_steps_in_lr_scheduler_is_an_error():
    d = base()
    d["lr_scheduler"]["total_steps"] = 100
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.total_steps: must not be set: "
                                          r"total_steps comes from training\.steps"):
        load_config(d)


def test_lr_scheduler_type_required_and_unknown():
    d = base()
    del d["lr_scheduler"]["type"]
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.type: required; one of \["):
        load_config(d)
    d["lr_scheduler"]["type"] = "CosineWithWarmupLR"
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.type: unknown scheduler "
                                          r"'CosineWithWarmupLR'.*did you mean "
                                          r"'CosineWithWarmUpLR'\?"):
        load_config(d)


def test_lr_scheduler_unknown_extension_key_lists_valid():
    d = base()
    d["lr_scheduler"]["warmup_step"] = 5
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.warmup_step: unknown key for "
                                          r"ConstantWarmUpLR; valid keys: .*did you mean "
                                          r"'warmup_steps'\?"):
        load_config(d)


def test_lr_scheduler_ignored_upstream_key_gets_advice():
    d = base(lr_scheduler={"type": "LinearWithWarmUpLR", "learning_rate": 1e-3,
                           "warmup_steps": 10, "lr_end": 1e-5})
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.lr_end: unknown key for "
                                          r"LinearWithWarmUpLR; valid keys: .*; \S"):
        load_config(d)


def test_lr_scheduler_base_lr_types():
    d = base(lr_scheduler={"type": "CosineAnnealingLR", "base_lr": 1e-3, "t_max": 50})
    cfg = load_config(d)
    assert cfg.lr_scheduler.base_lr == 1e-3 and "learning_rate" not in cfg.to_dict()[
        "lr_scheduler"]
    assert load_config(cfg.to_dict()) == cfg
    d["lr_scheduler"]["learning_rate"] = 1e-3
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.learning_rate: CosineAnnealingLR "
                                          r"takes its peak from base_lr.*write base_lr instead"):
        load_config(d)


def test_lr_scheduler_extension_fields_are_attributes():
    cfg = load_config(SEED_41)
    assert cfg.lr_scheduler.num_cycles == 0.5     # default filled from core.lr
    with pytest.raises(AttributeError, match="no field 'power'"):
        cfg.lr_scheduler.power


def test_lr_scheduler_values_checked_by_core_lr():
    d = base()
    d["lr_scheduler"]["warmup_steps"] = -1
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.warmup_steps: "):
        load_config(d)
    d = base()
    d["lr_scheduler"]["learning_rate"] = -1e-3
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.learning_rate: must be >= 0"):
        load_config(d)
    d["lr_scheduler"]["learning_rate"] = float("nan")
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.learning_rate: must be a finite"):
        load_config(d)


def test_warmup_ratio_wins_with_warning():
    d = base(lr_scheduler={"type": "ConstantWarmUpLR", "learning_rate": 1e-3,
                           "warmup_steps": 50, "warmup_ratio": 0.29})
    with pytest.warns(UserWarning, match="warmup_ratio wins"):
        plan = load_config(d).plan()
    assert plan.warmup_steps == 28  # int(100 * 0.29): truncation


def test_wsd_decay_start_ratio_in_plan():
    d = base(lr_scheduler={"type": "WarmUpStableDecayLR", "learning_rate": 1e-3,
                           "warmup_steps": 10, "lr_end": 1e-7, "decay_start_ratio": 0.8})
    plan = load_config(d).plan()
    assert plan.decay_start_steps == 80 and plan.warmup_steps == 10


def test_accumulation_divisibility_upstream_message():
    d = base(training={"steps": 10, "local_batch_size": 2, "global_batch_size": 5})
    with pytest.raises(ConfigError, match=r"^training\.global_batch_size: global_batch_size\(5\) "
                                          r"must be divisible by data_parallel\(1\) \* "
                                          r"local_batch_size\(2\)\."):
        load_config(d)


def test_data_parallel_from_msrun_world_size(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    cfg = load_config(base(training={"steps": 10, "local_batch_size": 2, "global_batch_size": 16}))
    plan = cfg.plan()
    assert plan.world_size == 4 and plan.data_parallel == 4 and plan.num_accumulation_steps == 2
    with pytest.raises(ConfigError, match=r"global_batch_size\(4\) must be divisible by "
                                          r"data_parallel\(4\) \* local_batch_size\(2\)"):
        load_config(base())


def test_parallel_degrees_exceed_world(monkeypatch):
    with pytest.raises(ConfigError, match=r"^parallelism: tensor_parallel\(2\) \* "
                                          r"pipeline_parallel\(1\) \* context_parallel\(1\) must "
                                          r"be less than or equal to world_size\(1\)\."):
        load_config(base(parallelism={"tensor_parallel": 2}))
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "3")
    with pytest.raises(ConfigError, match=r"^parallelism: world_size\(3\) must be divisible by "
                                          r"tensor_parallel\(2\)"):
        load_config(base(parallelism={"tensor_parallel": 2}))


@pytest.mark.parametrize("name", ["tensor_parallel", "pipeline_parallel", "context_parallel"])
def test_parallel_degrees_positive(name):
    with pytest.raises(ConfigError, match=rf"^parallelism\.{name}: must be >= 1, got -1"):
        load_config(base(parallelism={name: -1}))


def test_huge_int_for_float_fields():
    d = base()
    d["lr_scheduler"]["learning_rate"] = 10 ** 400
    with pytest.raises(ConfigError, match=r"^lr_scheduler\.learning_rate: must be a finite"):
        load_config(d)


def test_rampup_must_fit_data_parallel_units():
    d = base(training={"steps": 10, "local_batch_size": 2, "global_batch_size": 8,
                       "rampup_batch_size": [3, 5, 100]})
    with pytest.raises(ConfigError, match=r"^training\.rampup_batch_size\[0\]: 3 must be "
                                          r"divisible by data_parallel\(1\) \* "
                                          r"local_batch_size\(2\)\."):
        load_config(d)


def test_muon_requires_mla_model():
    d = base(optimizer={"type": "Muon"})
    with pytest.raises(ConfigError, match=r"^optimizer\.type: Current Muon implementation only "
                                          r"supports models with Multi-Latent Attention enabled"):
        load_config(d)
    d["model"] = {"model_type": "deepseek_v3"}
    assert load_config(d).optimizer.type == "Muon"
    d["model"] = {"model_type": "deepseek_v3", "multi_latent_attention": False}
    with pytest.raises(ConfigError, match=r"Multi-Latent Attention"):
        load_config(d)


# ---- overrides ----------------------------------------------------------------------------
def test_overrides_parse_yaml_values():
    cfg = load_config(SEED_41, overrides=[
        "training.steps=20", "optimizer.betas=[0.9,0.999]", "optimizer.eps=1e-6",
        "training.max_norm=null", "training.deterministic=True",
        "lr_scheduler.lr_end=1e-7", "model.hidden_size=32"])
    assert cfg.training.steps == 20 and cfg.optimizer.betas == [0.9, 0.999]
    assert cfg.optimizer.eps == 1e-6 and isinstance(cfg.optimizer.eps, float)
    assert cfg.training.max_norm is None and cfg.training.deterministic is True
    assert cfg.lr_scheduler.lr_end == 1e-7 and cfg.model.hidden_size == 32
    assert cfg.plan().total_steps == 20


def test_override_nested_and_new_section():
    cfg = load_config(base(), overrides=["optimizer.mup.base_hidden_size=32",
                                         "checkpoint.enable_save=True"])
    assert cfg.optimizer.mup.base_hidden_size == 32 and cfg.checkpoint.enable_save


def test_override_errors():
    with pytest.raises(ConfigError, match=r"^optimizer\.lr_foo: unknown key"):
        load_config(base(), overrides=["optimizer.lr_foo=1"])
    with pytest.raises(ConfigError, match=r"^optimiser: unknown section.*'optimizer'"):
        load_config(base(), overrides=["optimiser.eps=1e-6"])
    with pytest.raises(ConfigError, match=r"^training\.steps: expected an int, got str"):
        load_config(base(), overrides=["training.steps=abc"])
    with pytest.raises(ConfigError, match=r"^training\.steps: must be > 0"):
        load_config(base(), overrides=["training.steps=0"])
    with pytest.raises(ConfigError, match=r"^training\.steps\.x: cannot set: training\.steps is "
                                          r"a int, not a section"):
        load_config(base(), overrides=["training.steps.x=1"])
    with pytest.raises(ConfigError, match=r"^training\.steps: override must look like "
                                          r"section\.key=value"):
        load_config(base(), overrides=["training.steps"])
    with pytest.raises(ConfigError, match=r"override must look like"):
        load_config(base(), overrides=["=3"])
    with pytest.raises(ConfigError, match=r"^training\.steps: invalid YAML"):
        load_config(base(), overrides=["training.steps=[1,"])


def test_overrides_do_not_mutate_input():
    d = base()
    apply_overrides(d, ["training.steps=7"])
    assert d["training"]["steps"] == 100


# ---- round trip ---------------------------------------------------------------------------
@pytest.mark.parametrize("source", [SEED_41, SEED_42])
def test_to_dict_round_trip(source):
    cfg = load_config(source)
    d = cfg.to_dict()
    assert set(d) == {"training", "optimizer", "lr_scheduler", "model", "train_dataset",
                      "parallelism", "checkpoint", "eval_dataset", "tokenizer", "logging"}
    assert d["eval_dataset"] is None and d["tokenizer"] is None     # optional, absent
    assert "total_steps" not in d["lr_scheduler"]           # derived values stay in plan()
    assert "num_accumulation_steps" not in d["training"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = load_config(d)
    assert again == cfg
    assert again.to_dict() == d


def test_to_dict_fills_defaults():
    d = load_config(base()).to_dict()
    assert d["training"]["seed"] == 42 and d["optimizer"]["betas"] == [0.9, 0.95]
    assert d["lr_scheduler"]["warmup_lr_init"] == 0.0
    assert d["model"]["hidden_size"] == 64


def test_load_from_run_config_and_dict_equal():
    cfg = load_config(SEED_41)
    assert load_config(cfg) == cfg


def test_import_does_not_load_mindspore():
    code = ("import sys; import mindformers_core.config as c; "
            "c.load_config(sys.argv[1]).plan(); "
            "assert 'mindspore' not in sys.modules, 'mindspore imported'")
    root = os.path.dirname(os.path.dirname(FIX))
    subprocess.run([sys.executable, "-c", code, SEED_41], check=True, cwd=root)


def test_duplicate_key_in_yaml_is_an_error(tmp_path):
    p = tmp_path / "dup.yaml"
    p.write_text("training:\n  steps: 10\n  seed: 1\n  steps: 20\n"
                 "optimizer: {type: AdamW}\n"
                 "lr_scheduler: {type: ConstantWarmUpLR, warmup_steps: 0}\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: invalid YAML at line 4, column 3: found "
                                          r"duplicate key 'steps' \(first at line 2\)"):
        load_config(str(p))


def test_yaml_merge_keys_still_override(tmp_path):
    p = tmp_path / "merge.yaml"
    p.write_text("training: {steps: 10}\n"
                 "optimizer:\n  <<: {type: AdamW, weight_decay: 0.01}\n  weight_decay: 0.1\n"
                 "lr_scheduler: {type: ConstantWarmUpLR, warmup_steps: 0}\n")
    assert load_config(str(p)).optimizer.weight_decay == 0.1


def test_plan_rejects_a_shard_size_that_does_not_divide_data_parallel():
    from mindformers_core.config import ConfigError, load_config
    cfg = load_config({"training": {"steps": 10, "local_batch_size": 1, "global_batch_size": 4},
                       "optimizer": {"type": "AdamW"},
                       "lr_scheduler": {"type": "ConstantWarmUpLR", "warmup_steps": 0},
                       "parallelism": {"data_parallel_shard": 3}})
    with pytest.raises(ConfigError, match=r"parallelism.data_parallel_shard: .*must divide"):
        cfg.plan(world_size=4)
    assert cfg.plan(world_size=1).data_parallel == 1
