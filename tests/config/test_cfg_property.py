"""Property: for any YAML text or data tree, load_config returns a RunConfig or raises
ConfigError, never anything else."""
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mindformers_core.config import ConfigError, RunConfig, load_config
from mindformers_core.config.optimizer import OptimizerConfig

VALID = {
    "training": {"steps": 100, "local_batch_size": 2, "global_batch_size": 4, "max_norm": 1.0},
    "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01},
    "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 1e-5, "warmup_ratio": 0.01},
}
VALID_MUON = {
    "training": {"steps": 50, "local_batch_size": 1, "global_batch_size": 2,
                 "use_skip_step_on_nan": True},
    "optimizer": {"type": "Muon", "ns_coefficients": [[[3.4445, -4.775, 2.0315], 3],
                                                      [[2.0, -1.5, 0.5], 2]],
                  "param_overrides": [{"name": ["*bias"], "lr_mult": 2.0}],
                  "mup": {"base_hidden_size": 32}},
    "lr_scheduler": {"type": "WarmUpStableDecayLR", "learning_rate": 2e-2, "warmup_steps": 5,
                     "decay_start_ratio": 0.8},
    "model": {"model_type": "deepseek_v3"},
}
KEYS = sorted({k for sec in VALID.values() for k in sec} | set(VALID) | set(
    OptimizerConfig.field_names()) | {"model", "seq_length", "hidden_size", "total_steps",
                                      "warmup_steps", "lr_end", "decay_start_ratio",
                                      "param_overrides", "name", "lr_mult", "mup"})

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6), st.integers(), st.just(10 ** 400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["AdamW", "Muon", "SGD", "Lion", "WarmUpStableDecayLR", "ConstantWarmUpLR",
                     "deepseek_v3", "allgather", "1e-5", ".nan"]))
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=6), st.integers(-3, 3))
trees = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)), max_leaves=25)


def _load(obj):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = load_config(obj)
        except ConfigError:
            return None
    assert isinstance(out, RunConfig)
    # whatever loads also round-trips: to_dict() reloads to an equal config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert load_config(out.to_dict()) == out
    return out


def _mutate(base, path_value):
    import copy
    d = copy.deepcopy(base)
    (section, key), value = path_value
    if isinstance(value, dict) and section == "optimizer" and key == "param_overrides":
        value = [value]
    if isinstance(d.get(section), dict):
        d[section][key] = value
    else:
        d[section] = value
    return d


SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,  # reproducible in CI
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees)
def test_random_trees(tree):
    _load(tree if isinstance(tree, dict) else {"training": tree})


def test_bases_are_valid():
    assert _load(VALID) is not None and _load(VALID_MUON) is not None


@SETTINGS
@given(st.sampled_from([VALID, VALID_MUON]),
       st.tuples(st.tuples(st.sampled_from(sorted(VALID) + ["model", "parallelism"]),
                           st.sampled_from(KEYS)), trees))
def test_valid_config_with_one_garbled_value(base, path_value):
    _load(_mutate(base, path_value))


@SETTINGS
@given(st.text(alphabet=st.sampled_from(list("abc:-[]{}&*!|>'\"#%@`,? \n\t0123456789.e")),
               max_size=80))
def test_garbled_yaml_text(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("y") / "c.yaml"
    path.write_text(text, encoding="utf-8")
    _load(str(path))


@SETTINGS
@given(st.integers(0, 400), st.sampled_from(list(" :-[]{}\n#&*!0.ex\t")))
def test_corrupted_valid_yaml(tmp_path_factory, pos, char):
    import yaml
    text = yaml.safe_dump(VALID)
    text = text[:pos] + char + text[pos + 1:]
    path = tmp_path_factory.mktemp("y") / "c.yaml"
    path.write_text(text, encoding="utf-8")
    _load(str(path))


@pytest.mark.parametrize("text", ["a: &x [*x]", "training: !!python/object:os.system {}",
                                  "date: 2001-13-45", "? [a, b]\n: 1", "[" * 1100,
                                  "training: &t {steps: *t}"],
                         ids=["self-reference", "python-tag", "bad-date", "complex-key",
                              "deep-nesting", "recursive-section"])
def test_known_nasty_documents(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError):
        load_config(str(p))


@SETTINGS
@given(st.lists(st.text(alphabet=st.sampled_from(list("training.steps=optimizer.eps[]{}:,0123 "
                                                      "-e5nul")), max_size=30), max_size=3))
def test_random_override_strings(overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = load_config(VALID, overrides=overrides)
        except ConfigError:
            return
    assert isinstance(out, RunConfig)
