"""Regenerate ``data/mindformers_2_1_0_curves.json``: LR curves computed by MindFormers 2.1.0 itself.

Not a test (pytest does not collect it) and not run in CI: it needs the MindFormers wheel, which
the project does not depend on. The table it writes is what ``test_lr_compat.py`` compares
against. To regenerate (MindSpore CPU, any recent version)::

    pip download mindformers==2.1.0 --no-deps -d /tmp/mf
    cd /tmp/mf && unzip -q mindformers-2.1.0-py3-none-any.whl -d whl
    python tests/lr/make_upstream_table.py --wheel-root /tmp/mf/whl

Only ``mindformers/core/lr/lr_schedule.py`` of the wheel is loaded; its two imports from
``mindformers.tools`` (the class registry decorator and the logger) are replaced by trivial
stand-ins so that the rest of the package (and its dependencies) is not needed. Each value is
``float(sched(Tensor(step, int32)))`` in PyNative mode, exactly what the upstream trainer calls.
"""
import argparse
import importlib.util
import json
import logging
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "mindformers_2_1_0_curves.json")

# (type, upstream keyword arguments without total_steps, total_steps, last step evaluated)
# Chosen to cover every type, peaks 1e-5 .. 1e-1, floors, warmup steps/ratio/init, decay
# variants, and the configurations where upstream is not sane (NaN, negative, rising, dropping
# below the floor) so the tests can check what we do there.
CONFIGS = [
    ("ConstantWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10), 40, 80),
    ("ConstantWarmUpLR", dict(learning_rate=0.1, warmup_ratio=0.29, warmup_lr_init=1e-4), 50, 100),
    ("ConstantWarmUpLR", dict(learning_rate=5e-3, warmup_steps=0), 20, 40),
    ("LinearWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10), 40, 80),
    ("LinearWithWarmUpLR", dict(learning_rate=3e-4, warmup_ratio=0.07, warmup_lr_init=1e-5), 50, 100),
    ("LinearWithWarmUpLR", dict(learning_rate=0.1, warmup_steps=0), 17, 34),
    ("CosineWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10), 40, 80),
    ("CosineWithWarmUpLR", dict(learning_rate=3e-4, warmup_ratio=0.1, lr_end=3e-5), 50, 100),
    ("CosineWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=5, num_cycles=1.0, lr_end=1e-5), 30, 60),
    ("CosineWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=5, decay_steps=25), 40, 80),
    ("CosineWithWarmUpLR", dict(learning_rate=0.05, warmup_steps=5, decay_ratio=0.75, lr_end=1e-6), 40, 80),
    ("CosineWithWarmUpLR", dict(learning_rate=2e-2, warmup_lr_init=1e-3, warmup_steps=10, num_cycles=0.3), 30, 60),
    ("CosineWithWarmUpLR", dict(learning_rate=0.1, warmup_steps=3), 20, 40),
    ("CosineWithWarmUpLR", dict(learning_rate=1e-5, warmup_steps=0, num_cycles=0.3, decay_steps=60), 30, 60),
    ("CosineWithWarmUpLR", dict(learning_rate=0.1, warmup_steps=4, decay_steps=50, lr_end=1e-4), 30, 60),
    ("CosineWithRestartsAndWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10), 40, 80),
    ("CosineWithRestartsAndWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10, num_cycles=3.0, lr_end=1e-5), 50, 100),
    ("CosineWithRestartsAndWarmUpLR", dict(learning_rate=5e-3, warmup_ratio=0.2, num_cycles=2.0, decay_steps=35), 50, 100),
    ("CosineWithRestartsAndWarmUpLR", dict(learning_rate=5e-3, warmup_steps=0, num_cycles=2.5), 32, 64),
    ("CosineWithRestartsAndWarmUpLR", dict(learning_rate=0.1, warmup_steps=5, decay_steps=40, lr_end=1e-4), 30, 60),
    ("PolynomialWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10), 40, 80),
    ("PolynomialWithWarmUpLR", dict(learning_rate=1e-3, warmup_steps=10, power=2.0, lr_end=1e-5), 40, 80),
    ("PolynomialWithWarmUpLR", dict(learning_rate=0.1, warmup_steps=10, power=0.5, lr_end=1e-6), 40, 80),
    ("PolynomialWithWarmUpLR", dict(learning_rate=1e-3, warmup_ratio=0.1, decay_steps=60), 40, 80),
    ("PolynomialWithWarmUpLR", dict(learning_rate=2e-2, warmup_steps=5, decay_steps=20, lr_end=1e-6), 40, 80),
    ("PolynomialWithWarmUpLR", dict(learning_rate=2e-2, warmup_steps=5, decay_steps=20, power=2.0), 40, 80),
    ("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=10, decay_start_steps=30), 40, 80),
    ("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=10, decay_start_ratio=0.8, lr_end=1e-5), 50, 100),
    ("WarmUpStableDecayLR", dict(learning_rate=2e-2, warmup_ratio=0.05, warmup_lr_init=1e-4, decay_start_steps=25), 50, 100),
    ("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=20, decay_start_steps=10), 40, 80),
    ("WarmUpStableDecayLR", dict(learning_rate=0.1, warmup_steps=0, decay_start_steps=10, lr_end=1e-4), 30, 60),
    ("WarmUpStableDecayLR", dict(learning_rate=1e-4, warmup_steps=5, decay_start_steps=10, lr_end=5e-5), 20, 40),
    ("WarmUpStableDecayLR", dict(learning_rate=1e-3, warmup_steps=5, decay_start_steps=30), 30, 60),
    ("ConstantWithCoolDownLR", dict(learning_rate=1e-3, warmup_steps=5, keep_steps=5, decay_steps=10, final_steps=5, lr_end1=1e-5, lr_end2=1e-6), 30, 60),
    ("ConstantWithCoolDownLR", dict(learning_rate=1e-3, warmup_steps=5, lr_end1=1e-5), 25, 50),
    ("ConstantWithCoolDownLR", dict(learning_rate=0.1, warmup_ratio=0.1, decay_ratio=0.5, num_cycles=0.25, lr_end1=1e-4), 40, 80),
    ("ConstantWithCoolDownLR", dict(learning_rate=5e-3, warmup_steps=3, keep_steps=5, decay_steps=12, final_steps=4, lr_end1=2e-7, lr_end2=0.0), 30, 60),
    ("CosineAnnealingLR", dict(base_lr=1e-3, t_max=20), 40, 80),
    ("CosineAnnealingLR", dict(base_lr=5e-3, t_max=7, eta_min=1e-4), 40, 80),
    ("CosineAnnealingLR", dict(base_lr=0.1, t_max=10), 40, 80),
    ("CosineAnnealingLR", dict(base_lr=1e-2, t_max=3, eta_min=1e-5), 100, 200),
    ("CosineAnnealingWarmRestarts", dict(base_lr=1e-3, t_0=10), 40, 80),
    ("CosineAnnealingWarmRestarts", dict(base_lr=1e-3, t_0=10, t_mult=2, eta_min=1e-6), 80, 160),
    ("CosineAnnealingWarmRestarts", dict(base_lr=5e-3, t_0=7, t_mult=3), 50, 100),
    ("CosineAnnealingWarmRestarts", dict(base_lr=0.1, t_0=3, t_mult=2), 50, 100),
    ("CosineAnnealingWarmRestarts", dict(base_lr=0.1, t_0=1, t_mult=3, eta_min=1e-5), 65, 130),
    ("LearningRateWiseLayer", dict(lr_scale=0.5, base_lr=dict(type="CosineWithWarmUpLR", learning_rate=1e-3, warmup_steps=5)), 30, 60),
    ("LearningRateWiseLayer", dict(lr_scale=3.0, base_lr=dict(type="WarmUpStableDecayLR", learning_rate=2e-2, warmup_steps=5, decay_start_steps=20)), 30, 60),
]


def load_upstream(wheel_root):
    """The wheel's lr_schedule module, with stand-ins for its two mindformers.tools imports."""
    tools = types.ModuleType("mindformers.tools")
    register = types.ModuleType("mindformers.tools.register")
    register.MindFormerModuleType = types.SimpleNamespace(LR="lr")
    register.MindFormerRegister = types.SimpleNamespace(register=lambda *a, **k: (lambda c: c))
    logger = types.ModuleType("mindformers.tools.logger")
    logger.logger = logging.getLogger("mindformers")
    for name, mod in [("mindformers", types.ModuleType("mindformers")), ("mindformers.tools", tools),
                      ("mindformers.tools.register", register), ("mindformers.tools.logger", logger)]:
        sys.modules[name] = mod
    path = os.path.join(wheel_root, "mindformers", "core", "lr", "lr_schedule.py")
    spec = importlib.util.spec_from_file_location("mf_lr_schedule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(mf, kind, params, total):
    params = dict(params)
    if kind == "LearningRateWiseLayer":
        inner = dict(params["base_lr"])
        base = build(mf, inner.pop("type"), inner, total)
        return mf.LearningRateWiseLayer(base_lr=base, lr_scale=params["lr_scale"])
    return getattr(mf, kind)(total_steps=total, **params)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel-root", required=True, help="folder the wheel was unzipped into")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    import mindspore as ms
    from mindspore import Tensor
    import mindspore.common.dtype as mstype
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    mf = load_upstream(args.wheel_root)
    rows = []
    for kind, params, total, last in CONFIGS:
        sched = build(mf, kind, params, total)
        values = [float(sched(Tensor(s, mstype.int32)).asnumpy()) for s in range(last + 1)]
        rows.append({"type": kind, "params": params, "total_steps": total, "values": values})
        print(kind, params, "done", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"source": "MindFormers 2.1.0 mindformers/core/lr/lr_schedule.py, "
                             "sched(Tensor(step, int32)) for step = 0 .. len(values) - 1",
                   "mindspore": ms.__version__, "device": "CPU", "configs": rows}, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
