"""docs/migrating_from_mindformers.md and docs/configuration.md cannot go stale on
`parallelism:`: their key table is the code's (config/compat/parallel_noop.py ``key_table``,
built from the accepted-value tables the config checks with) and every field of
ParallelismConfig has a row; and each row of the guide's upstream-only `model:` table says what
the config does with the values it lists."""
import dataclasses
import os
import re

import pytest
import yaml

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.compat.parallel_noop import key_rows, key_table
from mindformers_core.config.parallelism import ParallelismConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "migrating_from_mindformers.md")
FIELDS = [(f.name, f.default) for f in dataclasses.fields(ParallelismConfig)]


@pytest.mark.parametrize("doc", [DOC, os.path.join(ROOT, "docs", "configuration.md")])
def test_the_parallelism_key_table_is_the_code_s(doc):
    with open(doc, encoding="utf-8") as fh:
        block = fh.read().split("<!-- parallelism-keys -->")[1]
    assert block.strip() == key_table(FIELDS)


def test_every_parallelism_field_has_a_row_and_a_new_one_must_get_one():
    assert [key.strip("`") for key, _ in key_rows(FIELDS)] == [name for name, _ in FIELDS]
    with pytest.raises(KeyError, match=r"parallelism\.brand_new has no row"):
        key_rows(FIELDS + [("brand_new", 0)])


def test_the_degrees_are_not_documented_as_1_only():
    rows = dict(key_rows(FIELDS))
    for name in ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel",
                 "pipeline_parallel_interleave_num"):
        assert rows[f"`{name}`"].startswith(">= 1"), name


def _model_rows():
    with open(DOC, encoding="utf-8") as fh:
        text = fh.read()
    block = text.split("### Upstream-only model keys")[1].split("\n\n")[1]
    rows = [line for line in block.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def _other(value):
    """A value of the same type that no row lists as accepted."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return 0.1 if value == 0 else value * 3 + 0.5
    return "not_a_listed_value"



DSV3 = os.path.join(ROOT, "configs", "muon_deepseek_v3_tiny.yaml")
#: rows whose values are not plain settings of one key on the tiny DeepSeek-V3
_NOT_SETTINGS = ("architectures", "moe_shared_expert_intermediate_size",
                 "max_position_embeddings")


@pytest.mark.parametrize("row", _model_rows(), ids=lambda r: r[0])
def test_each_model_key_row_says_what_the_config_does(row):
    """The upstream-only `model:` table cannot go stale: every value a row lists loads, and a
    row that says its feature is not implemented refuses another value so."""
    keys = re.findall(r"`(\w+)`", row[0])
    if any(k in _NOT_SETTINGS for k in keys):
        pytest.skip("a class name / a formula, not a setting (test_upstream_yaml.py loads them)")
    values = [yaml.safe_load(v) for v in re.findall(r"`([\w.+-]+)`", row[1])]
    if row[1].startswith("null"):
        values.append(None)
    if row[1].startswith("any int"):
        values += [0, 1]
    elif row[1].startswith("any number"):
        values += [1.0, 0.5]
    assert values, row
    for key in keys:
        for value in values:
            load_config(DSV3, overrides=[f"model.{key}={yaml.safe_dump(value).split()[0]}"])
        if "not implemented" in row[2]:
            other = _other(values[0])
            with pytest.raises(ConfigError, match="not implemented"):
                load_config(DSV3, overrides=[f"model.{key}={other}"])
