"""Every code block in docs/*.md that is YAML or a shell command is valid.

* ``yaml`` blocks parse (YAML 1.2 floats). A block with top-level config sections loads with
  ``load_config``: the training/optimizer/lr_scheduler sections it lacks come from a minimal
  base, a plausible run rather than the defaults (and a Muon block without a model gets the
  tiny DeepSeek-V3 preset, since Muon needs MLA). A block marked
  ``<!-- check: invalid -->`` must fail with ``ConfigError``; ``fragment``/``skip`` are exempt.
* ``bash``/``shell``/``sh`` blocks: every ``python run_mindformer.py ...`` command parses with
  the real argument parser and passes ``--check`` on its config (exit 0) after the documented
  overrides; every ``python -m MODULE ...`` / ``python SCRIPT.py ...`` names a module or file
  that exists and only flags its ``--help`` lists; ``bash scripts/X.sh "CMD" ...`` names an
  existing script and its quoted command is checked the same way; ``pip install -e`` and
  ``python -m pytest PATH`` name existing paths.
* Relative links and images in the Markdown point to existing files.
"""
import contextlib
import functools
import glob
import importlib.util
import os
import re
import subprocess
import sys

import pytest

import run_mindformer
from doc_blocks import code_blocks, shell_commands
from mindformers_core.config import ConfigError, load_config
from mindformers_core.config.yaml_io import load_yaml_text
from mindformers_core.tools.data_check import missing_data_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
SECTIONS = ("training", "optimizer", "lr_scheduler", "model", "train_dataset", "parallelism",
            "checkpoint", "monitor", "profiler", "context", "callbacks", "recompute",
            "recompute_comm", "swap", "lora_config")
BASE = {"training": {"steps": 1000}, "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3}}
SHELLS = ("bash", "shell", "sh", "console")


def _blocks(langs):
    out = []
    for path in DOCS:
        for b in code_blocks(path):
            if b.lang in langs and b.mark != "skip":
                out.append(b)
    return out


def _rel(block):
    return f"{os.path.relpath(block.path, ROOT)}:{block.line}"


def _tiny_dsv3_model():
    with open(os.path.join(ROOT, "configs", "model_presets", "tiny_deepseek_v3.yaml"),
              encoding="utf-8") as fh:
        return load_yaml_text(fh.read())["model"]


def test_docs_exist_and_have_blocks():
    names = {os.path.basename(p) for p in DOCS}
    for required in ("index.md", "quickstart.md", "configuration.md", "optimizers_and_schedules.md",
                     "batch_size_and_lr_scaling.md", "mixed_precision.md", "muon.md",
                     "data_parallel.md", "checkpoints.md", "tools.md", "differences.md",
                     "performance.md", "troubleshooting.md"):
        assert required in names
    assert len(_blocks(("yaml",))) >= 10 and len(_blocks(SHELLS)) >= 10


@pytest.mark.parametrize("block", _blocks(("yaml", "yml")), ids=_rel)
def test_yaml_block(block):
    data = load_yaml_text(block.text)
    if block.mark == "fragment":
        return
    assert isinstance(data, dict), f"{block.where}: a YAML block must be a mapping of sections"
    unknown = [k for k in data if k not in SECTIONS]
    assert not unknown, f"{block.where}: not config sections: {unknown} (mark fragments)"
    merged = {**BASE, **data}
    if merged["optimizer"].get("type") == "Muon" and "model" not in data:
        merged["model"] = _tiny_dsv3_model()
    if block.mark == "invalid":
        with pytest.raises(ConfigError):
            load_config(merged).plan()
        return
    load_config(merged).plan()


# ------------------------------------------------------------------------------ shell commands
@functools.lru_cache(maxsize=None)
def _help(target: tuple) -> str:
    proc = subprocess.run([sys.executable, *target, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, f"{' '.join(target)} --help failed: {proc.stderr[-500:]}"
    return proc.stdout


def _flags(args):
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def _check_run_mindformer(args, where, capsys):
    parser = run_mindformer.build_parser()
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:  # argparse error
        pytest.fail(f"{where}: run_mindformer.py {' '.join(args)}: bad arguments ({exc})")
    assert os.path.exists(os.path.join(ROOT, ns.config)), f"{where}: no config {ns.config}"
    argv = ["--config", os.path.join(ROOT, ns.config), "--mode", str(ns.mode), "--check"]
    # a production recipe's dataset is not on this machine: check the rest with the built-in one
    argv += missing_data_overrides(os.path.join(ROOT, ns.config), ROOT)
    for item in ns.overrides:
        argv += ["--set", item]
    code = run_mindformer.main(argv)
    out = capsys.readouterr()
    # a valid full-size config that does not fit one process ends with the memory FAIL (exit 1)
    too_big = code == 1 and any(line.startswith("[FAIL] memory") for line in out.out.splitlines())
    assert code == 0 or too_big, f"{where}: run_mindformer.py {' '.join(args)} fails --check: " \
                                 f"{out.err}"


@contextlib.contextmanager
def _launched_by_msrun(workers: int):
    """The environment msrun gives its workers (a world of ``workers``; 1: unchanged)."""
    if workers <= 1:
        yield
        return
    saved = {k: os.environ.get(k) for k in ("MS_ROLE", "MS_WORKER_NUM")}
    os.environ.update({"MS_ROLE": "MS_WORKER", "MS_WORKER_NUM": str(workers)})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_command(argv, where, capsys):
    prog = os.path.basename(argv[0])
    if prog in ("python", "python3"):
        if len(argv) < 2:
            return
        if argv[1] == "-m":
            module, rest = argv[2], argv[3:]
            if module == "pytest":
                for path in (a for a in rest if not a.startswith("-")):
                    assert os.path.exists(os.path.join(ROOT, path)), f"{where}: no {path}"
                return
            if module == "pip":
                return
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
            text = _help(("-m", module))
            if rest and re.search(rf"\{{[^}}]*\b{re.escape(rest[0])}\b[^}}]*\}}", text):
                # a subcommand (argparse lists them as {a,b}): its flags are in its own help
                text, rest = _help(("-m", module, rest[0])), rest[1:]
        else:
            script, rest = argv[1], argv[2:]
            assert os.path.isfile(os.path.join(ROOT, script)), f"{where}: no file {script}"
            if os.path.basename(script) == "run_mindformer.py":
                _check_run_mindformer(rest, where, capsys)
                return
            text = _help((script,))
        for flag in _flags(rest):
            assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", text), \
                f"{where}: {' '.join(argv[:3])} has no flag {flag}"
    elif prog in ("bash", "sh") and len(argv) >= 2 and argv[1].endswith(".sh"):
        assert os.path.isfile(os.path.join(ROOT, argv[1])), f"{where}: no script {argv[1]}"
        if len(argv) >= 3 and argv[2] != "CMD":
            # the launcher's worker count is the world the inner command is checked on
            workers = argv[3] if len(argv) >= 4 and argv[3].isdigit() else "1"
            with _launched_by_msrun(int(workers)):
                for inner in shell_commands(argv[2]):
                    _check_command(inner, where, capsys)
    elif prog == "pip":
        for path in (a for a in argv[2:] if not a.startswith("-") and a.startswith(".")):
            target = re.sub(r"\[.*\]$", "", path)
            assert os.path.exists(os.path.join(ROOT, target)), f"{where}: no {path}"


@pytest.mark.parametrize("block", _blocks(SHELLS), ids=_rel)
def test_shell_block(block, capsys):
    commands = shell_commands(block.text)
    assert commands, f"{block.where}: empty shell block"
    for argv in commands:
        _check_command(argv, block.where, capsys)


# ------------------------------------------------------------------------------ links
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(path):
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+://", target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0]
        assert os.path.exists(os.path.join(os.path.dirname(path), file_part)), \
            f"{os.path.relpath(path, ROOT)}: broken link {target}"


def test_invalid_marker_really_checks(tmp_path):
    """The invalid marker is honoured only when the config really fails (else the test fails)."""
    md = tmp_path / "x.md"
    md.write_text("<!-- check: invalid -->\n```yaml\ntraining: {steps: 10}\n"
                  "optimizer: {type: AdamW}\nlr_scheduler: {type: ConstantWarmUpLR}\n```\n",
                  encoding="utf-8")
    (block,) = code_blocks(str(md))
    with pytest.raises(pytest.fail.Exception):
        test_yaml_block(block)


@pytest.mark.parametrize("command, fragment", [
    ("python run_mindformer.py --config configs/nope.yaml --mode 1", "no config"),
    ("python run_mindformer.py --config configs/quickstart.yaml --mode 1 --set training.stepz=3",
     "fails --check"),
    ("python run_mindformer.py --config configs/quickstart.yaml --mode 1 --frobnicate",
     "bad arguments"),
    ("python -m mindformers_core.tools.plot_lr --config configs/quickstart.yaml --colour red",
     "has no flag --colour"),
    ("python -m mindformers_core.tools.no_such_tool", "no module"),
    ('bash scripts/msrun_launcher.sh "python run_mindformer.py --config configs/x.yaml --mode 1" 2',
     "no config"),
])
def test_shell_checker_catches_broken_commands(command, fragment, capsys):
    (argv,) = shell_commands(command)
    with pytest.raises(AssertionError if fragment != "bad arguments" else pytest.fail.Exception,
                       match=re.escape(fragment)):
        _check_command(argv, "doc.md:1", capsys)
