"""YAML 1.2 core scalars (no sexagesimal/hex/octal numbers, no yes/no booleans, no dates) and
bounded alias expansion: a billion-laughs document is refused fast, messages stay short."""
import os
import time

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.errors import MAX_MESSAGE_CHARS, truncate_message
from mindformers_core.config.yaml_io import MAX_EXPANDED_NODES, load_yaml_text


@pytest.mark.parametrize("text,value", [
    ("1:30", "1:30"), ("0x10", "0x10"), ("0o17", "0o17"), ("1_000", "1_000"), ("yes", "yes"),
    ("no", "no"), ("on", "on"), ("Off", "Off"), ("y", "y"), ("2024-01-01", "2024-01-01"),
    ("010", 10), ("+3", 3), ("-7", -7), ("1e-5", 1e-5), ("2.E+3", 2000.0), (".5", 0.5),
    ("-.inf", float("-inf")), ("True", True), ("false", False), ("~", None), ("null", None),
    ("", None),
])
def test_plain_scalars_follow_the_yaml_1_2_core_schema(text, value):
    assert load_yaml_text(f"a: {text}") == {"a": value}


QUICK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "configs", "quickstart.yaml")


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("field,text,message", [
    ("training.steps", "1:30", r"^training.steps: expected an int, got str \('1:30'\)"),
    ("training.steps", "0x10", r"^training.steps: expected an int, got str \('0x10'\)"),
    ("training.use_skip_step_on_nan", "yes",
     r"^training.use_skip_step_on_nan: expected a bool \(True/False\), got str \('yes'\)"),
    ("optimizer.weight_decay", "1:30", r"^optimizer.weight_decay: expected a number, got str"),
])
def test_yaml_1_1_lookalikes_are_errors_naming_the_field(tmp_path, field, text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(QUICK, overrides=[f"{field}={text}"])
    # the same in a file
    with open(QUICK) as fh:
        base = fh.read()
    key = field.split(".")[1]
    lines = base.splitlines()
    section = field.split(".")[0] + ":"
    lines = [x for x in lines if not x.strip().startswith(f"{key}:")]
    lines.insert(lines.index(section) + 1, f"  {key}: {text}")
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, "\n".join(lines) + "\n"))


def billion_laughs(levels=9):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return lines


def test_alias_bomb_in_a_scalar_field_is_refused_fast(tmp_path):
    path = write(tmp_path, "\n".join(billion_laughs()) + "\ntraining:\n  steps: *a8\n")
    t0 = time.process_time()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert time.process_time() - t0 < 5          # the reproducer ran 76-88 s to a MemoryError
    msg = str(err.value)
    assert f"expands to more than {MAX_EXPANDED_NODES:,} nodes through its aliases" in msg
    assert len(msg) < 300


def test_alias_bomb_in_an_override_is_refused():
    with pytest.raises(ConfigError, match=r"^training.steps: invalid YAML .*alias bomb"):
        load_config({}, overrides=["training.steps=[" + ", ".join(
            ["&a0 [1,1,1,1,1,1,1,1,1,1]"] + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]"
                                             for i in range(1, 7)]) + "]"])


def test_shared_anchors_below_the_bound_still_load():
    data = load_yaml_text("base: &b {x: 1, y: [1, 2]}\nmore:\n  <<: *b\n  y: [3]\n")
    assert data == {"base": {"x": 1, "y": [1, 2]}, "more": {"x": 1, "y": [3]}}
    with pytest.raises(Exception, match="self-referencing anchor"):
        load_yaml_text("a: &x [1, *x]\n")


def test_messages_with_huge_values_are_truncated():
    big = "x" * 100_000
    err = ConfigError("a.b", f"got {big!r}")
    assert len(str(err)) < MAX_MESSAGE_CHARS + 60 and str(err).startswith("a.b: got 'xxx")
    assert "characters cut" in str(err)
    assert truncate_message("short") == "short"
    # a large (but bounded) list in an int field gives a short message
    values = ", ".join(["1"] * 50_000)
    with pytest.raises(ConfigError) as info:
        load_config({}, overrides=[f"training.steps=[{values}]"])
    assert len(str(info.value)) < MAX_MESSAGE_CHARS + 60
