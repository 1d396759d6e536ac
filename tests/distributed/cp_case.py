"""The context-parallel Trainer cases (``test_cp_train_msrun.py``), as data: each is N msrun
workers against the 1-process Trainer on the same global batch (4, as 2 micro-batches of 2),
10 steps, per-step loss and grad_norm at rel 1e-4.

``CASES``: name -> (workers, model, parallelism overrides). ``config(name, out_dir, parallel)``
builds its Trainer config, with (the workers) or without (the 1-process reference) the
parallelism overrides; every case of one world runs in one launch (``cp_train_worker.py``).
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STEPS = 10
RTOL = 1e-4

COMMON = (f"training.steps={STEPS}", "training.local_batch_size=2",
          "training.global_batch_size=4", "lr_scheduler.learning_rate=1e-3",
          "checkpoint.enable_save=false")
DOCS = ("train_dataset.reset_attention_mask=true", "train_dataset.reset_position_ids=true")
#: model -> (config file, its overrides): GPT; the tiny DeepSeek-V3 with Muon and QK-Clip
#: active (threshold 1.0: below its heads' max logits); that DeepSeek-V3 with one MTP depth
MODELS = {
    "gpt": ("configs/markov_check.yaml", ()),
    "dsv3": ("configs/muon_deepseek_v3_tiny.yaml", ("optimizer.qk_clip_threshold=1.0",)),
    "dsv3_mtp": ("configs/muon_deepseek_v3_tiny.yaml",
                 ("optimizer.qk_clip_threshold=1.0", "model.num_nextn_predict_layers=1",
                  "model.mtp_loss_scaling_factor=0.3")),
    # document masking (models/documents.py): positions and attention restart after each
    # end-of-document id, one of the corpus' frequent tokens (1-4 per 32-token GPT sample,
    # about one per 16-token DeepSeek-V3 sample)
    "gpt_docs": ("configs/markov_check.yaml", DOCS + ("train_dataset.eod_id=6",)),
    "dsv3_mtp_docs": ("configs/muon_deepseek_v3_tiny.yaml",
                      ("optimizer.qk_clip_threshold=1.0", "model.num_nextn_predict_layers=1",
                       "model.mtp_loss_scaling_factor=0.3", "train_dataset.eod_id=44") + DOCS),
}


def cp_overrides(cp: int, method: str, degree=None):
    out = [f"parallelism.context_parallel={cp}", f"parallelism.context_parallel_method={method}"]
    return tuple(out + ([f"parallelism.ulysses_degree_in_cp={degree}"] if degree else []))


CASES = {
    "cp2_colossal_gpt": (2, "gpt", cp_overrides(2, "colossal")),
    "cp2_ulysses_gpt": (2, "gpt", cp_overrides(2, "ulysses")),
    "cp2_colossal_dsv3": (2, "dsv3", cp_overrides(2, "colossal")),
    "cp2_ulysses_dsv3": (2, "dsv3", cp_overrides(2, "ulysses")),
    "cp2_colossal_dsv3_mtp": (2, "dsv3_mtp", cp_overrides(2, "colossal")),
    "cp4_hybrid_gpt": (4, "gpt", cp_overrides(4, "hybrid", 2)),
    "cp2_dp2_colossal_gpt": (4, "gpt", cp_overrides(2, "colossal")),
    # document masking: each core cuts the blocks of the whole mask it holds (the parallel
    # training guide's EOD data, section 3.3, is the hybrid example's)
    "cp2_colossal_gpt_docs": (2, "gpt_docs", cp_overrides(2, "colossal")),
    "cp2_ulysses_dsv3_mtp_docs": (2, "dsv3_mtp_docs", cp_overrides(2, "ulysses")),
    "cp4_hybrid_gpt_docs": (4, "gpt_docs", cp_overrides(4, "hybrid", 2)),
}
#: the metrics compared per step, per model: the DeepSeek-V3's QK-Clip max logit (MAX over
#: the cp ranks) and its aux loss (the sequence-wise aux loss over whole sequences), the MTP
#: loss (whole-sequence shifts and counts)
METRICS = {"gpt": ("loss", "grad_norm"),
           "dsv3": ("loss", "grad_norm", "max_attention_logit", "aux_loss"),
           # its logged aux_loss is (aux + mtp) - mtp in float32: ~1e-7 absolute noise on 2e-4
           "dsv3_mtp": ("loss", "grad_norm", "max_attention_logit", "mtp_loss")}
METRICS["gpt_docs"], METRICS["dsv3_mtp_docs"] = METRICS["gpt"], METRICS["dsv3_mtp"]


def cases_of(workers: int):
    return [name for name, case in CASES.items() if case[0] == workers]


def config(name: str, out_dir: str, parallel: bool = True):
    from mindformers_core.config import load_config
    _, model, par = CASES[name]
    path, model_overrides = MODELS[model]
    return load_config(os.path.join(ROOT, path), overrides=list(
        COMMON + model_overrides + (par if parallel else ())))
