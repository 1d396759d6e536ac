"""docs/parallelism.md cannot go stale: its table of what runs is config/layout.py's
LAYOUT_TABLE, every refused layout it lists is refused naming that field, and its worked
example's groups are ParallelDims'."""
import os
import re

import pytest

from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.layout import LAYOUT_TABLE
from mindformers_core.core.parallel_dims import make_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "parallelism.md")


def table(marker):
    text = open(DOC, encoding="utf-8").read()
    block = text.split(f"<!-- {marker} -->")[1]
    rows = [line for line in block.strip().splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_what_runs_is_the_code_s_table():
    assert [tuple(r) for r in table("layout-table")] == list(LAYOUT_TABLE)


@pytest.mark.parametrize("row", table("refused-table"), ids=lambda r: r[0])
def test_each_refused_layout_is_refused_naming_its_field(monkeypatch, row):
    _, sets, field = row
    world = re.search(r"\(world (\d+)\)", row[0])   # 4 unless the row names its world
    monkeypatch.setenv("MS_WORKER_NUM", world.group(1) if world else "4")
    monkeypatch.delenv("MS_ROLE", raising=False)
    config = ("muon_deepseek_v3_tiny.yaml" if "DeepSeek-V3" in row[0] else "markov_check.yaml")
    overrides = re.findall(r"[\w.]+=[\w.]+", sets.strip("`"))
    with pytest.raises(ConfigError) as err:
        load_config(os.path.join(ROOT, "configs", config), overrides=overrides)
    assert str(err.value).startswith(field.strip("`") + ":"), str(err.value)


def test_the_worked_example_is_the_mesh():
    dims = make_mesh(8, tp=2)
    want = [[str(r), str(dims.coords(r)["tp"]), str(dims.coords(r)["dp"]),
             " ".join(map(str, dims.group_of("tp", r))),
             " ".join(map(str, dims.group_of("dp", r)))] for r in range(8)]
    assert table("example-table") == want
