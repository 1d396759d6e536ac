"""The runs of tests/distributed/test_eval_tp_msrun.py: configs/quickstart.yaml, 4 steps of
local batch 4 in a global batch of 8, 2 held-out batches per evaluation, as

* ``eval``: held-out evaluations at steps 2 and 4 and a 16-token greedy sample;
* ``long``: no evaluation before the last step and a 50-token sample (the prompt's 18 bytes
  plus 50 pass ``seq_length`` 64: decoding past the cache's window).

Each names its overrides; ``TP`` adds tensor parallelism (sequence parallel) on 2 ranks.
:func:`write_ep_config` writes the quickstart with its ``model:`` replaced by
configs/model_presets/tiny_deepseek_v3.yaml's (eval_layout_case.py's ``dsv3``).
A few steps leave the quickstart model sampling spaces, so :func:`untrained_sample` also
decodes from the seeded initial weights, whose top ids vary from token to token."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TP = ["parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true"]
BASE = ["training.steps=4", "training.local_batch_size=4", "training.global_batch_size=8",
        "training.eval_steps=2", "training.log_interval=1", "checkpoint.enable_save=false"]
CASES = {
    "eval": ["training.eval_interval=2", "logging.sample_max_new_tokens=16"],
    "long": ["training.eval_interval=null", "logging.sample_max_new_tokens=50"],
}



def config(name: str, overrides=()):
    from mindformers_core.config import load_config
    return load_config(os.path.join(ROOT, "configs", "quickstart.yaml"),
                       overrides=BASE + CASES[name] + list(overrides))


def write_ep_config(path: str) -> str:
    """The quickstart yaml with the tiny DeepSeek-V3's model section, written to ``path``."""
    import yaml
    with open(os.path.join(ROOT, "configs", "quickstart.yaml")) as fh:
        d = yaml.safe_load(fh)
    with open(os.path.join(ROOT, "configs", "model_presets", "tiny_deepseek_v3.yaml")) as fh:
        d["model"] = yaml.safe_load(fh)["model"]
    with open(path, "w") as fh:
        yaml.safe_dump(d, fh)
    return path


PROMPT = b"The with statement"
NEW_TOKENS = 50     # 18 + 50 > seq_length 64
SAMPLED_TOKENS = 20
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 3}


def run(name: str, run_dir: str, overrides=()):
    """Train case ``name`` into ``run_dir``: (the Trainer, the run log's text: rank 0's, ''
    elsewhere)."""
    return train_logged(config(name, overrides), run_dir)


def train_logged(cfg, run_dir: str):
    """Train ``cfg`` into ``run_dir``: (the Trainer, the run log's text)."""
    import io
    from mindformers_core.trainer import Trainer
    stream = io.StringIO()
    trainer = Trainer(cfg, run_dir, overwrite=True, stream=stream)
    trainer.train()
    return trainer, stream.getvalue()


def untrained_model(group_comm=None):
    """The quickstart model with its seeded initial weights (tensor parallel over
    ``group_comm`` when given)."""
    from mindformers_core.models import build_model
    model = build_model(config("long").model, seed=7, jit="none")
    return model if group_comm is None else model.apply_tensor_parallel(group_comm)


def untrained_sample(model):
    """The greedy ids after :data:`PROMPT` from :func:`untrained_model`."""
    from mindformers_core.models.generation import generate
    return generate(model, list(PROMPT), NEW_TOKENS)
