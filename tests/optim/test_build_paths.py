"""One path from config to optimizer: every optimizer built from YAML, from a dict and from
keyword arguments, in fresh processes with either import order (config first or optim
first), has the same parameter groups and gives the same updates (bit for bit)."""
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for order in ("config-first", "optim-first"):
        path = str(tmp_path_factory.mktemp(order) / "out.npz")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "build_paths_worker.py"), path,
                               order], capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PYTHONPATH=REPO))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with np.load(path) as data:
            out[order] = {k: data[k] for k in data.files}
    return out


def cases(results):
    return sorted({k.split(".")[0] for k in results["config-first"]})


@pytest.mark.slow
def test_yaml_dict_kwargs_and_import_orders_agree(results):
    ref = results["config-first"]
    names = cases(results)
    assert {"adamw_defaults", "sgd_defaults", "lion_defaults", "muon_defaults"} <= set(names)
    for name in names:
        want_groups = str(ref[f"{name}.yaml.groups"])
        want = ref[f"{name}.yaml.params"]
        for order in ("config-first", "optim-first"):
            for way in ("yaml", "dict", "kwargs"):
                got = results[order]
                assert str(got[f"{name}.{way}.groups"]) == want_groups, (name, order, way)
                np.testing.assert_array_equal(got[f"{name}.{way}.params"], want,
                                              err_msg=f"{name} {order} {way}")


@pytest.mark.slow
def test_the_updates_are_not_trivial(results):
    """Each case moved the parameters, and the cases differ from each other (a test that
    compared unchanged parameters could not fail)."""
    ref = results["config-first"]
    updates = {n: ref[f"{n}.yaml.params"] for n in cases(results)}
    for a in updates:
        for b in updates:
            if a < b:
                assert not np.array_equal(updates[a], updates[b]), (a, b)


def test_dict_errors_keep_the_optimizer_message_and_configs_get_the_path():
    """A dict is a programmatic caller: a failed optimizer rule has the class's message; the
    same section from YAML (OptimizerConfig) names the field."""
    from mindformers_core.config import ConfigError, OptimizerConfig
    from mindformers_core.optim.build import as_optimizer_config
    with pytest.raises(ValueError, match=r"^Muon does not support swap\.$"):
        as_optimizer_config({"type": "Muon", "swap": True})
    with pytest.raises(ConfigError, match=r"^optimizer\.swap: Muon does not support swap\.$"):
        OptimizerConfig.from_dict({"type": "Muon", "swap": True}, "optimizer")
    with pytest.raises(ConfigError, match=r"^optimizer\.betas: "):     # not a rule: the path
        as_optimizer_config({"type": "AdamW", "betas": [0.9]})
    with pytest.raises(TypeError, match="takes an OptimizerConfig or a dict, got list"):
        as_optimizer_config([("type", "AdamW")])
    cfg = OptimizerConfig.from_dict({"type": "SGD"}, "optimizer")
    assert as_optimizer_config(cfg) is cfg
