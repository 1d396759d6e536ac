"""The model-parallel runs of the sharded-checkpoint test (``test_mp_checkpoint_msrun.py``):
each feature's tiny run for 6 steps with a checkpoint at step 4 (and at the end), once on 2
msrun workers (``distributed=True``) and once on one process with the same global batch.

* ``tp``: the tiny GPT of ``tp_case`` with AdamW, ``tensor_parallel: 2`` + sequence parallel;
* ``fsdp``: the Markov-check GPT of ``trainer_case``, ``optim_grads_params`` (on one process the
  strategy changes nothing);
* ``ep``: the tiny DeepSeek-V3 of ``ep_case`` with AdamW, ``expert_parallel: 2``.
"""
import os

STEPS = 6
SAVE_AT = 4
CASES = ("tp", "fsdp", "ep")


def _ckpt(out_dir: str):
    return [f"training.steps={STEPS}", "checkpoint.enable_save=true",
            f"checkpoint.save_interleaved_steps={SAVE_AT}", "checkpoint.save_max=5",
            f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}"]


def case_config(name: str, out_dir: str, distributed: bool, overrides=()):
    """The Trainer config of case ``name`` writing to ``out_dir``."""
    extra = _ckpt(out_dir) + list(overrides)
    if name == "tp":
        from tp_case import TP, gpt_config
        return gpt_config(out_dir, (TP if distributed else []) + extra)
    if name == "fsdp":
        from trainer_case import trainer_config
        return trainer_config(out_dir, [
            "parallelism.data_parallel_shard_strategy=optim_grads_params"] + extra)
    if name == "ep":
        from ep_case import case_config as ep_config
        return ep_config("adamw", 2 if distributed else 1, overrides=extra)
    raise ValueError(f"unknown case {name!r}; expected one of {CASES}")


def train(name, out, distributed=False, overrides=()):
    """Case ``name`` trained into ``out`` (one process unless ``distributed``)."""
    import io
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(case_config(name, str(out), distributed, overrides), str(out),
                      stream=io.StringIO())
    trainer.train()
    return trainer


def checkpoint_at(out_dir: str, step: int) -> str:
    return os.path.join(out_dir, "checkpoint", f"mindformers_core_step{step:08d}.safetensors")
