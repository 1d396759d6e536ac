"""Worker of test_build_paths: builds every optimizer from YAML text, from a dict and from
keyword arguments in one fresh process, with the imports in the order given on the command
line, runs two steps and writes the groups and the updated parameters to an .npz file.

    python build_paths_worker.py OUT.npz config-first|optim-first
"""
import sys

OUT, ORDER = sys.argv[1], sys.argv[2]
if ORDER == "config-first":
    from mindformers_core.config import OptimizerConfig  # noqa: F401
    from mindformers_core.optim import build_optimizer  # noqa: F401
else:
    from mindformers_core.optim.muon import Muon  # noqa: F401
    from mindformers_core.optim import build_optimizer  # noqa: F401
    from mindformers_core.config import OptimizerConfig  # noqa: F401

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
import yaml  # noqa: E402
from mindspore import Tensor  # noqa: E402

from mindformers_core.config.strict_yaml import load_strict_yaml  # noqa: E402
from mindformers_core.models.build import build_model  # noqa: E402
from mindformers_core.optim.adamw import AdamW  # noqa: E402
from mindformers_core.optim.lion import Lion  # noqa: E402
from mindformers_core.optim.muon import Muon  # noqa: E402,F811
from mindformers_core.optim.param_groups import get_param_groups  # noqa: E402
from mindformers_core.optim.sgd import SGD  # noqa: E402

ms.set_context(mode=ms.PYNATIVE_MODE)
# synchronous dispatch, as the trainer runs on CPU (trainer/pynative.py): asynchronously each
# Parameter.set_data of the optimizers waited ~2.5 ms for the queue (7 of this worker's 19 s)
from mindformers_core.trainer.pynative import apply_pynative_synchronize  # noqa: E402
apply_pynative_synchronize(True)
TINY = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "num_layers": 2,
        "num_attention_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4, "v_head_dim": 8, "ffn_hidden_size": 64, "n_routed_experts": 2,
        "num_experts_per_tok": 1, "moe_intermediate_size": 16, "seq_length": 8}

# (YAML text of the optimizer section, the class, the same section as keyword arguments)
CASES = {
    "adamw_defaults": ("type: AdamW\n", AdamW, {}),
    "adamw_set": ("type: AdamW\nbetas: [0.8, 0.9]\neps: 1.0e-6\nweight_decay: 0.05\n", AdamW,
                  dict(betas=(0.8, 0.9), eps=1e-6, weight_decay=0.05)),
    "sgd_defaults": ("type: SGD\n", SGD, {}),
    "sgd_set": ("type: SGD\nsgd_momentum: 0.5\nweight_decay: 0.02\n", SGD,
                dict(momentum=0.5, weight_decay=0.02)),
    "lion_defaults": ("type: Lion\n", Lion, {}),
    "lion_set": ("type: Lion\nlion_beta1: 0.9\nlion_beta2: 0.99\n", Lion, dict(betas=(0.9, 0.99))),
    "muon_defaults": ("type: Muon\n", Muon, {}),
    "muon_set": ("type: Muon\nmomentum: 0.9\nadamw_betas: [0.9, 0.95]\nweight_decay: 0.05\n"
                 "adamw_lr_mult: 0.5\nqk_clip_enabled: false\n", Muon,
                 dict(momentum=0.9, adamw_betas=(0.9, 0.95), weight_decay=0.05, adamw_lr_mult=0.5,
                      qk_clip_enabled=False)),
    "muon_lion_branch": ("type: Muon\nmuon_scalar_optimizer: lion\n", Muon,
                         dict(muon_scalar_optimizer="lion")),
}


def group_summary(opt):
    keys = ("lr", "lr_mult", "weight_decay", "wd_mult", "eps", "betas", "momentum", "optimizer")
    return repr([[(k, g.get(k)) for k in keys] + [("params", [p.name for p in g["params"]])]
                 for g in opt.param_groups])


def run(opt, params):
    rng = np.random.default_rng(0)
    for _ in range(2):
        opt.step([Tensor(rng.standard_normal(p.shape).astype(np.float32)) for p in params])
    return np.concatenate([p.asnumpy().astype(np.float64).ravel() for p in params])


out = {}
for name, (text, cls, kwargs) in CASES.items():
    for way in ("yaml", "dict", "kwargs"):
        model = build_model(dict(TINY), seed=0)
        section = yaml.safe_load(text)
        if way == "yaml":
            cfg = OptimizerConfig.from_dict(load_strict_yaml(text), "optimizer")
            opt = build_optimizer(cfg, model)
        elif way == "dict":
            opt = build_optimizer(section, model)
        else:
            groups = get_param_groups(model, OptimizerConfig.from_dict(section, "optimizer"))
            extra = {"model": model} if cls is Muon else {}
            opt = cls(groups, **kwargs, **extra)
        assert type(opt) is cls, (name, way, type(opt))
        out[f"{name}.{way}.groups"] = np.array(group_summary(opt))
        out[f"{name}.{way}.params"] = run(opt, list(opt.parameters))
np.savez(OUT, **out)
