"""The tiny training run of the trainer-level data-parallel tests (the Markov check's model and
data, few steps, a checkpoint every 2 steps)."""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 6

#: the PyNative path (``training.jit: none``) of the parallel cases that test a layout rather
#: than the compiled layers: under ``jit: layer`` every new model compiles each layer's graph
#: (about 8 s a graph per process on the 2-core CPU, and a 4-worker launch has 4 processes
#: compiling at once), which was more than half of each case's time (measured on the
#: layout-matrix launches: 994 s of first steps against 717 s of all later steps). The compiled
#: layers under each layout still run the way a user runs them: the eval-layout matrix
#: (eval_layout_case.py, the quickstart config with its defaults) and tp_case's
#: ``dsv3_muon_layer``.
PYNATIVE = "training.jit=none"


def trainer_config(out_dir: str, overrides=()):
    from mindformers_core.config import load_config
    return load_config(os.path.join(ROOT, "configs", "markov_check.yaml"), overrides=(
        TRAINER_OVERRIDES + [f"checkpoint.save_path={os.path.join(out_dir, 'checkpoint')}"]
        + list(overrides)))


#: the run of ``trainer_config`` on configs/markov_check.yaml (without its save_path)
TRAINER_OVERRIDES = [
    f"training.steps={STEPS}", "training.local_batch_size=2", "training.global_batch_size=4",
    "model.hidden_size=32", "model.seq_length=16", "checkpoint.save_interleaved_steps=2",
    "checkpoint.save_max=5", PYNATIVE]


#: the MTP variant (tests/distributed/test_mtp_loss_msrun.py): one depth module, 4 steps, no
#: checkpoints
MTP_OVERRIDES = ["model.num_nextn_predict_layers=1", "model.mtp_loss_scaling_factor=0.3",
                 "training.steps=4", "checkpoint.enable_save=False"]

#: the Trainer run under fully sharded data parallel (the same run on one process); no
#: checkpoints (a sharded checkpoint's format belongs to the checkpoint package)
FSDP_OVERRIDES = ("parallelism.data_parallel_shard_strategy=optim_grads_params",
                  "checkpoint.enable_save=False")
