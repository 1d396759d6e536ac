"""The layout advisor's top layout on 4 msrun CPU workers under a per-rank cap that rules out
plain data parallelism (a GPT: tensor parallel; a DeepSeek-V3: expert parallel): it runs, and
its ``memory_bytes_per_rank`` is within 15% of rank 0's largest ``rss_mb`` in metrics.jsonl.
Run under the shared lock (``flock /work/wt/notes/msrun.lock python -m pytest ...``). The
step-time order of several layouts is bench/plan_layout_check.py's (noisy on a shared CPU)."""
import json
import os
import shlex
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "distributed"))

from msrun_util import launch, read_metrics, worker_logs  # noqa: E402

from bench.plan_layout_check import MODELS  # noqa: E402
from mindformers_core.config import load_config  # noqa: E402
from mindformers_core.core.device_profiles import get_profile  # noqa: E402
from mindformers_core.tools.layout_search import candidate_overrides, search  # noqa: E402
from mindformers_core.tools.plan_layout import parse_device_memory  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


#: measured 2026-12-02 (bench/plan_layout_check.py, 3 steps): both top layouts run, but the
#: prediction is low: GPT tp4 660 MiB vs rank 0's 1177 MiB, DeepSeek-V3 ep2 643 vs 916 MiB.
#: The CPU baseline is a single process's (540 MiB); an msrun worker holds more (the
#: communicator, its buffers) and what it adds grows with the model: not calibrated yet.
UNDER = "predicted memory 30-44% below the msrun worker's rss (docs/plan_layout.md)"


class PredictionOff(AssertionError):
    """The prediction misses the measured rss by more than 15% (the expected failure: only
    this one is; a layout that does not run fails the test)."""


@pytest.mark.parametrize("name, model_parallel", [
    pytest.param("gpt", "tp", marks=pytest.mark.xfail(reason=UNDER, raises=PredictionOff,
                                                      strict=False)),
    pytest.param("dsv3", "ep", marks=pytest.mark.xfail(reason=UNDER, raises=PredictionOff,
                                                       strict=False))])
def test_top_layout_runs_and_memory_matches(tmp_path, name, model_parallel):
    config, overrides, cap = MODELS[name]
    cfg = load_config(config, overrides=overrides)
    found, _ = search(cfg, 4, get_profile("cpu"), parse_device_memory(cap), source=config,
                      overrides=overrides, top=1)
    assert found, f"nothing fits {cap}"
    top = found[0]
    assert getattr(top.candidate, model_parallel) > 1, top.candidate.describe()
    sets = overrides + candidate_overrides(top.candidate) + ["training.steps=2",
                                                             "checkpoint.enable_save=False"]
    out = tmp_path / "run"
    cmd = (f"python run_mindformer.py --config {config} --mode 1 --output_dir {out} "
           + " ".join("--set " + shlex.quote(s) for s in sets))
    proc, _ = launch(cmd, tmp_path / "logs", workers=4)
    assert proc.returncode == 0, worker_logs(tmp_path / "logs", 4)
    rss = max(r["rss_mb"] for r in read_metrics(out) if "rss_mb" in r) * 2 ** 20
    err = top.memory_bytes / rss - 1
    if abs(err) > 0.15:
        raise PredictionOff(json.dumps({"layout": top.candidate.describe(),
                                        "predicted_mb": top.memory_bytes / 2 ** 20,
                                        "rss_mb": rss / 2 ** 20}))
