"""docs/recipes.md shows the memory planner's per-rank estimate of DeepSeek-V3 671B under
upstream's layout exactly as the documented tool command prints it, and the command line of the
tool behaves as documented (errors, exit codes)."""
import os
import re
import shlex

import pytest

from mindformers_core.tools import memory_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = re.compile(r"<!-- memory-plan:begin -->\n(.*?)\n<!-- memory-plan:end -->", re.S)


def _tool(argv, capsys):
    code = memory_report.main(argv)
    out = capsys.readouterr()
    return code, out.out.strip(), out.err


def test_recipes_doc_matches_the_planner(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with open(os.path.join(ROOT, "docs", "recipes.md"), encoding="utf-8") as fh:
        match = BLOCK.search(fh.read())
    assert match, "docs/recipes.md lacks the memory-plan block"
    argv = shlex.split(memory_report.UPSTREAM_671B_COMMAND)[3:]
    code, out, _ = _tool(argv, capsys)
    assert code == 1   # the routed experts' state has no ZeRO group to shard over (edp 1)
    assert match.group(1).strip() == out
    assert "tp 8, pp 8, ep 32" in out and "**FAIL**" in out
    with open(os.path.join(ROOT, "docs", "memory.md"), encoding="utf-8") as fh:
        assert memory_report.UPSTREAM_671B_COMMAND in fh.read()


def test_tool_fails_the_671b_preset_on_one_process(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, _ = _tool(["--config", "configs/npu/deepseek_v3_adamw.yaml",
                          "--device-target", "CPU"], capsys)
    assert code == 1
    assert "[FAIL]" in out and "per rank (dp 1" in out and "no single fix fits" in out


@pytest.mark.parametrize("layout,message", [
    ("dp=4,xx=2", "--layout: expected KEY=N with KEY one of"),
    ("dp=four", "--layout: expected KEY=N"),
    ("dp=12,ep=3", "layout.ep(3) must divide n_routed_experts (256)"),
])
def test_tool_layout_errors(layout, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, _, err = _tool(["--config", "configs/npu/deepseek_v3_adamw.yaml", "--layout", layout],
                         capsys)
    assert code == 2 and message in err
