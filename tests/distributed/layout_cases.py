"""Every msrun case of the suite, as data for the layout-matrix harness (``layout_matrix.py``):
one launch per world size runs the cases of that world in the order below.

To add a layout (N workers against one process, the real Trainer on both sides), append a
``TrainerCase`` to ``LAYOUTS``; ``test_layout_cases_msrun.py`` compares it. A check that looks
inside a rank is a ``JobCase`` (a worker function) under the group of the test module that
reads its directory.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from layout_matrix import Group, JobCase, TrainerCase  # noqa: E402
from trainer_case import MTP_OVERRIDES, PYNATIVE, TRAINER_OVERRIDES  # noqa: E402

MARKOV = "configs/markov_check.yaml"
DSV3 = "configs/muon_deepseek_v3_tiny.yaml"
#: the composed cp cases: 6 steps, global batch 4 as micro-batches of 2, lr 1e-3
CP_COMMON = ("training.steps=6", "training.local_batch_size=2", "training.global_batch_size=4",
             "lr_scheduler.learning_rate=1e-3", "model.seq_length=16",
             "checkpoint.enable_save=false")
CP_SAVE = ("checkpoint.enable_save=true", "checkpoint.save_interleaved_steps=4")
CP2 = ("parallelism.context_parallel=2",)
TP2 = ("parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true")
#: QK-Clip active: below the tiny DeepSeek-V3's max logits at seq_length 16 (0.06 - 0.09), so
#: heads clip every step and a wrong MAX over dp x cp would change the weights
DSV3_QK = ("optimizer.qk_clip_threshold=0.05", "training.steps=4")
DSV3_METRICS = ("loss", "grad_norm", "max_attention_logit", "aux_loss", "qk_clipped_heads")

#: tp x FSDP (issue 30): global batch 8 as micro-batches of 2 (dp 2: 2 each), lr 1e-3; the
#: layers in PyNative (trainer_case.PYNATIVE: these cases test layouts, and compiling each new
#: model's layer graphs was most of their time; the cp cases run PyNative anyway)
TPF_COMMON = ("training.global_batch_size=8", "training.local_batch_size=2",
              "lr_scheduler.learning_rate=1e-3", "model.seq_length=16", PYNATIVE)
FSDP_PARAMS = ("parallelism.data_parallel_shard_strategy=optim_grads_params",)
NO_SHARD = ("parallelism.data_parallel_shard_strategy=no_shard",)
#: the 8-worker cases: global batch 8, local batch 1 (issue 30's hidden check), lr 1e-3,
#: PyNative layers (as TPF_COMMON)
UPSTREAM8_COMMON = ("training.global_batch_size=8", "training.local_batch_size=1",
                    "lr_scheduler.learning_rate=1e-3", "model.num_layers=4",
                    "optimizer.qk_clip_threshold=0.05", "training.steps=5",
                    "model.num_nextn_predict_layers=1", "model.mtp_loss_scaling_factor=0.3",
                    PYNATIVE)
#: one multi-token prediction depth (DeepSeek-V3's, a MoE layer on the tiny model)
MTP1 = ("model.num_nextn_predict_layers=1", "model.mtp_loss_scaling_factor=0.3")
#: with MTP the logged aux_loss is (aux + mtp) - mtp in float32, about 1e-7 absolute noise on
#: 4e-4 (rel 1.5e-4 measured): the aux loss reaches the compared grad_norm and later losses
UPSTREAM8_METRICS = ("loss", "grad_norm", "max_attention_logit", "qk_clipped_heads",
                     "mtp_loss")
UPSTREAM8_SAVE = ("checkpoint.enable_save=true", "checkpoint.save_interleaved_steps=2",
                  "checkpoint.save_max=4")

#: N workers == 1 process through the Trainer, compared per step (test_layout_cases_msrun.py)
LAYOUTS = [
    # tp2 x FSDP dp2: every weight stores its dp rows of its tp slice (a row-parallel weight
    # is split in two dimensions), gathered per layer; the run saves at step 4 and resumes
    # there under the same layout (the model's rows on top of its tp layout); split from one
    # file by tools/convert_checkpoint.py, its rank files come back bit for bit
    TrainerCase("tp2_fsdp2_gpt", 4, MARKOV, TPF_COMMON + ("training.steps=6",) + CP_SAVE,
                layout=TP2 + FSDP_PARAMS, rtol=1e-5, steps=6, resume_at=4,
                checks=("rows_stored", "split_rebuilds"), one_process_at=4),
    # optim_grads: weights whole, gradients reduce-scattered to the rows of each tp slice
    TrainerCase("tp2_fsdp_grads_gpt", 4, MARKOV, TPF_COMMON + ("training.steps=6",) + CP_SAVE,
                layout=TP2 + ("parallelism.data_parallel_shard_strategy=optim_grads",),
                rtol=1e-5, steps=6),
    # Muon on the two-dimensional shards, both comm strategies exact, QK-Clip active (the
    # clip scales the local rows of the local heads); one MTP depth cut over tp, its rows
    # gathered over dp
    TrainerCase("tp2_fsdp2_dsv3_allgather", 4, DSV3, TPF_COMMON + DSV3_QK + MTP1,
                layout=TP2 + FSDP_PARAMS + ("optimizer.comm_strategy=allgather",),
                metrics=UPSTREAM8_METRICS, steps=4,
                checks=("qk_clip_active", "rows_stored", "finite_mtp_loss")),
    # ep2 x FSDP over dp 4 (edp 2): the experts cut over ep first, the dense weights split
    # over dp 4; one MTP depth (its own unit, its head another); saves at step 4 and
    # resumes there (dense rows, whole experts)
    TrainerCase("ep2_fsdp4_dsv3", 4, DSV3, TPF_COMMON + DSV3_QK[:1] + ("training.steps=6",)
                + CP_SAVE + MTP1, layout=("parallelism.expert_parallel=2",) + FSDP_PARAMS,
                metrics=UPSTREAM8_METRICS, steps=6, resume_at=4,
                checks=("qk_clip_active", "finite_mtp_loss")),
    # tp2 x ep2 x FSDP dp2 (ep folded over tp x dp): the experts cut first (whole on their
    # ep rank), FSDP then stores the dp rows of every dense weight's tp slice (the router
    # gathered where the tp ranks route their own tokens); saves at step 4, resumes there,
    # and the merged checkpoint resumes on one process
    TrainerCase("tp2_ep2_fsdp2_dsv3", 4, DSV3, TPF_COMMON + DSV3_QK[:1] + ("training.steps=6",)
                + CP_SAVE, layout=TP2 + FSDP_PARAMS + ("parallelism.expert_parallel=2",
                                                       "optimizer.comm_strategy=allgather"),
                metrics=DSV3_METRICS, steps=6, resume_at=4, one_process_at=4,
                checks=("qk_clip_active",)),
    # pp2 x ep2 x FSDP dp2: each stage's experts over its ep group, its dense weights' rows
    # over its dp group, one MTP depth on the last stage (the embedding's rows read there
    # too); saves at step 4, resumes there and on one process
    TrainerCase("pp2_ep2_fsdp2_dsv3", 4, DSV3, TPF_COMMON + DSV3_QK[:1] + (
        "training.steps=6", "model.num_layers=4") + CP_SAVE + MTP1,
        layout=("parallelism.pipeline_parallel=2", "parallelism.expert_parallel=2")
        + FSDP_PARAMS, metrics=UPSTREAM8_METRICS, steps=6, resume_at=4, one_process_at=4,
        checks=("qk_clip_active", "finite_mtp_loss")),
    TrainerCase("ep2_fsdp_grads_dsv3", 4, DSV3, TPF_COMMON + DSV3_QK,
                layout=("parallelism.expert_parallel=2",
                        "parallelism.data_parallel_shard_strategy=optim_grads"),
                metrics=DSV3_METRICS, steps=4, checks=("qk_clip_active",)),
    # the 8-worker launch (issue 30): upstream's 8-card PyNative layout (dp_shard 2 x ep 2 x
    # tp 2 x pp 2 x interleave 2, ZeRO-1 over the shards of 2; ep folded over each stage's
    # tp x dp) on the 4-layer tiny DeepSeek-V3, Muon with QK-Clip active, the expert bias and
    # one MTP depth on the last stage (its layer cut over tp, its experts over ep)
    # its step-2 checkpoint (the pipeline's single file) resumes on one process, and on
    # pp2 x tp2 (interleave 2) at 4 workers (upstream8_resumed_pp2_tp2)
    TrainerCase("upstream8_dsv3", 8, DSV3, UPSTREAM8_COMMON + UPSTREAM8_SAVE,
                layout=TP2 + ("parallelism.pipeline_parallel=2",
                              "parallelism.pipeline_parallel_interleave_num=2",
                              "parallelism.expert_parallel=2",
                              "parallelism.data_parallel_shard=2"),
                metrics=UPSTREAM8_METRICS, steps=5, checks=("qk_clip_active", "finite_mtp_loss"),
                one_process_at=2),
    # the 8-worker checkpoint of step 2 resumed on 4 workers as pp2 x tp2 (+sp, interleave
    # 2, no ep: the routed experts whole on every rank, dp 1): steps 3-5 equal the
    # uninterrupted 8-worker run's and the one process's
    TrainerCase("upstream8_resumed_pp2_tp2", 4, DSV3, UPSTREAM8_COMMON + UPSTREAM8_SAVE,
                layout=TP2 + ("parallelism.pipeline_parallel=2",
                              "parallelism.pipeline_parallel_interleave_num=2"),
                metrics=UPSTREAM8_METRICS, resume_from=("upstream8_dsv3", 2)),
    # pp2 x tp2 x FSDP dp2: each stage's weights stored as dp rows of its tp slices; saves at
    # step 2 and resumes there (the pipeline checkpoint gathers the rows into the slices)
    TrainerCase("pp2_tp2_fsdp2_gpt", 8, MARKOV, TPF_COMMON + (
        "training.steps=4", "checkpoint.enable_save=true", "checkpoint.save_interleaved_steps=2"),
        layout=TP2 + FSDP_PARAMS + ("parallelism.pipeline_parallel=2",), rtol=1e-5, steps=4,
        resume_at=2, one_process_at=2),
    # upstream's 8-card cp4 hybrid (ulysses degree 2) x tp2 x ep2 (dp 1, issue 32): the
    # all-to-all on each tp rank's 2 local heads inside pairs of cp ranks, the ring across
    # them; ep folded over tp x cp (the tp group), one MTP depth, QK-Clip active; the dense
    # gradients reduce-scattered to rows over the 4 cp ranks (cp x tp x ep x FSDP, optim_grads;
    # cp x tp x ep with ZeRO-1 is cp2_tp2_ep4_dsv3)
    TrainerCase("cp4_hybrid_tp2_ep2_dsv3", 8, DSV3, CP_COMMON + DSV3_QK + (
        "model.num_nextn_predict_layers=1", "model.mtp_loss_scaling_factor=0.3"),
        layout=("parallelism.context_parallel=4", "parallelism.context_parallel_method=hybrid",
                "parallelism.ulysses_degree_in_cp=2", "parallelism.expert_parallel=2",
                "parallelism.data_parallel_shard_strategy=optim_grads") + TP2,
        metrics=UPSTREAM8_METRICS, steps=4,
        checks=("qk_clip_active", "finite_mtp_loss", "moe_layers_whole")),
    # cp2 x pp2 (interleave 2, ulysses) x tp2 x ep2 (dp 1, issue 32): each stage's 4 ranks
    # are cp2 x tp2 with ep folded over them; the stages pass each cp rank's sequence-parallel
    # chunk rows; 4 layers, one MTP depth on the last stage, QK-Clip active (MAX over the
    # stage's dp x cp); the dense gradients as rows over each stage's cp ranks (cp x pp x
    # tp x ep x FSDP, optim_grads; with ZeRO-1: eval layout cp2pp2ep2 and upstream8_dsv3);
    # its step-2 pipeline checkpoint resumes on one process
    TrainerCase("cp2_pp2_vpp2_tp2_ep2_dsv3", 8, DSV3, CP_COMMON + DSV3_QK + (
        "model.num_layers=4", "model.num_nextn_predict_layers=1",
        "model.mtp_loss_scaling_factor=0.3") + UPSTREAM8_SAVE,
        layout=CP2 + TP2 + ("parallelism.pipeline_parallel=2",
                            "parallelism.pipeline_parallel_interleave_num=2",
                            "parallelism.context_parallel_method=ulysses",
                            "parallelism.expert_parallel=2",
                            "parallelism.data_parallel_shard_strategy=optim_grads"),
        metrics=UPSTREAM8_METRICS, steps=4,
        checks=("qk_clip_active", "finite_mtp_loss", "moe_layers_whole"), one_process_at=2),
    TrainerCase("tp2_fsdp2_dsv3_deredundency", 4, DSV3, TPF_COMMON + DSV3_QK,
                layout=TP2 + FSDP_PARAMS + ("optimizer.comm_strategy=allgather_deredundency",),
                metrics=DSV3_METRICS, steps=4, checks=("qk_clip_active",)),
    # the logged mtp_loss is the global batch's (the mean over the ranks): dp 2, 4 steps,
    # under FSDP (each depth one unit, upstream's DeepSeek-V3 1b 8-card config's layout)
    TrainerCase("dp2_fsdp2_mtp", 2, MARKOV, tuple(TRAINER_OVERRIDES + MTP_OVERRIDES),
                layout=FSDP_PARAMS, metrics=("mtp_loss", "loss", "grad_norm"), rtol=1e-4,
                steps=4, checks=("finite_mtp_loss",)),
    # composed context parallel (issue 32), 4 workers, global batch 4 (2 micro-batches of 2
    # on each replica): cp2 x tp2 (+sp), gradients over dp x cp; the colossal one saves at
    # step 4 and resumes there under the same layout
    TrainerCase("cp2_tp2_colossal_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + TP2 + ("parallelism.context_parallel_method=colossal",),
                steps=6, resume_at=4),
    TrainerCase("cp2_tp2_ulysses_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,   # the same reference
                layout=CP2 + TP2 + ("parallelism.context_parallel_method=ulysses",), steps=6),
    # cp x FSDP: the cp ranks of a replica hold the same weights, so FSDP splits them over
    # dp x cp (the dp_cp group): dp2 x cp2 stores a quarter of each weight per rank; saves at
    # step 4, resumes there, and the merged checkpoint resumes on one process (the same
    # reference as the cp2 x tp2 cases)
    TrainerCase("cp2_fsdp4_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + FSDP_PARAMS, steps=6, resume_at=4, one_process_at=4,
                checks=("cp_rows_stored",)),
    # no_shard under cp (cp2 x dp2) and under tp (tp2 x dp2): every rank keeps the whole
    # optimizer state of its weights (of its tp slices), no ZeRO-1 rows
    # (ParallelismConfig.optimizer_shards); the cp case saves at step 4 and resumes there
    # (the same reference as the cp2 x tp2 cases)
    TrainerCase("cp2_dp2_no_shard_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + NO_SHARD, steps=6, resume_at=4, checks=("state_replicated",)),
    TrainerCase("tp2_dp2_no_shard_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=TP2 + NO_SHARD, steps=6, checks=("state_replicated",)),
    # cp2 x tp2 x FSDP (dp 1): the rows of each tp slice over the two cp ranks, ulysses
    TrainerCase("cp2_tp2_fsdp2_ulysses_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + TP2 + FSDP_PARAMS + ("parallelism.context_parallel_method=ulysses",),
                steps=6),
    # cp2 x pp2 x FSDP (dp 1, colossal): each stage's weights split over its two cp ranks
    # (dp_cp), the ring inside each stage; saves at step 4 (the pipeline checkpoint gathers
    # the rows over dp x cp) and resumes there, and on one process
    TrainerCase("cp2_pp2_fsdp2_gpt", 4, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + FSDP_PARAMS + ("parallelism.pipeline_parallel=2",), steps=6,
                resume_at=4, one_process_at=4),
    # MLA under dp2 x cp2 with FSDP: Muon's exchange over the dp x cp rows, QK-Clip active
    # (no moe_layers_whole: the recomputed units count the routing statistics twice,
    # distributed/fsdp.py; the aux loss is compared)
    TrainerCase("cp2_fsdp4_dsv3", 4, DSV3, CP_COMMON + DSV3_QK, layout=CP2 + FSDP_PARAMS,
                metrics=DSV3_METRICS, steps=4, checks=("qk_clip_active",)),
    # dp 1: the gradients reduce-scattered over the two cp ranks alone (optim_grads)
    TrainerCase("cp2_fsdp_grads_gpt", 2, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + ("parallelism.data_parallel_shard_strategy=optim_grads",),
                steps=6),
    # recompute under cp (issue 32), against one process without it: the recomputed layers
    # (MLA, MoE, QK-Clip active) rerun the ring passes in the backward; selective recompute's
    # core_attention reruns the ulysses all-to-alls around the inner core
    TrainerCase("cp2_recompute_full_dsv3", 2, DSV3, CP_COMMON + DSV3_QK,
                layout=CP2 + ("recompute.mode=full",), metrics=DSV3_METRICS, steps=4,
                checks=("qk_clip_active",)),
    TrainerCase("cp2_recompute_core_ulysses_gpt", 2, MARKOV, CP_COMMON + CP_SAVE,
                layout=CP2 + ("parallelism.context_parallel_method=ulysses",
                              "recompute.mode=select", "recompute.select_module="
                              "{'layers.*.self_attention.core_attention': [0, 1]}"), steps=6),
    # MLA under cp2 x tp2 (colossal) x ep4 (dp 1), Muon with QK-Clip active (MAX over dp x
    # cp, per local head): ep folds over tp x cp x dp (core/parallel_dims.py), so the ep group
    # is all 4 ranks (its tp and cp ranks), edp 1; each cp rank's tensor x expert runner
    # dispatches its chunks' sequence-parallel tokens
    TrainerCase("cp2_tp2_ep4_dsv3", 4, DSV3, CP_COMMON + DSV3_QK,
                layout=CP2 + TP2 + ("parallelism.expert_parallel=4",), metrics=DSV3_METRICS,
                steps=4, checks=("qk_clip_active", "moe_layers_whole")),
    # dp2 x cp2 with ep2: ep folds over cp x dp (core/parallel_dims.py), so the ep group is
    # the cp group; per-sequence counts and the aux loss over whole sequences
    TrainerCase("cp2_ep2_dsv3", 4, DSV3, CP_COMMON + DSV3_QK,
                layout=CP2 + ("parallelism.expert_parallel=2",), metrics=DSV3_METRICS,
                steps=4, checks=("qk_clip_active", "moe_layers_whole")),
    # cp2 x ep2 x FSDP dp2 (issue 32): the dense weights' rows over the 4 dp x cp ranks, the
    # experts whole on their ep rank (ep folded over cp x dp); saves at step 4 and resumes
    # there (no moe_layers_whole: FSDP's recomputed units count the routing twice)
    TrainerCase("cp2_ep2_fsdp4_dsv3", 4, DSV3, CP_COMMON + DSV3_QK[:1] + CP_SAVE,
                layout=CP2 + ("parallelism.expert_parallel=2",) + FSDP_PARAMS,
                metrics=DSV3_METRICS, steps=6, resume_at=4,
                checks=("qk_clip_active", "cp_rows_stored")),
]


# -- the job adapters: a test module's worker run with this case's directory ------------------
def dp_job(case_dir, killed_checkpoint):
    """dp_case.CASES, then the resume of the fault test's run from its last checkpoint."""
    from dp_case import CASES
    from dp_worker import main
    main(case_dir, list(CASES), (killed_checkpoint, os.path.join(case_dir, "resumed")))


def fsdp_job(case_dir):
    from dp_case import FSDP_SHARDED
    from fsdp_worker import main
    main(case_dir, os.path.join(case_dir, "trainer"), FSDP_SHARDED)


def mp_ckpt_job(case_dir, single_dir):
    """Each model-parallel feature in turn, each resuming its one-process checkpoint."""
    from mp_ckpt_case import CASES, SAVE_AT, checkpoint_at
    from mp_ckpt_worker import main
    for name in CASES:
        main(case_dir, name, checkpoint_at(os.path.join(single_dir, name), SAVE_AT))


def moe_dp_job(case_dir):
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from moe_dp_worker import moe_dp_config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(moe_dp_config(case_dir), case_dir).train()


# -- the prepare steps (the pytest process, before the world's launch) -------------------------
#: the step in which rank 1 of the fault test SIGKILLs itself (test_dp_msrun.py)
KILL_AT = 5
#: the step the sharded-checkpoint runs stop at and resume from (test_sharded_checkpoint_msrun)
STOP_AT = 4
#: rounds of every collective in group_comm_worker.py
GROUP_COMM_ROUNDS = 2


def prepare_dp(out):
    """The fault test: the real Trainer on 2 workers, rank 1 SIGKILLs itself in step KILL_AT
    (a launch of its own: the launcher's behaviour is what it tests)."""
    from msrun_util import launch
    proc, elapsed = launch(f"python {os.path.join(HERE, 'kill_worker.py')} {out} {KILL_AT}",
                           os.path.join(out, "logs"))
    return {"proc": proc, "elapsed": elapsed, "out": out,
            "checkpoint": os.path.join(out, "checkpoint")}


def prepare_mp_ckpt(out):
    """The one-process run of each model-parallel feature (the workers resume its step-4
    checkpoint); the parameter shapes of each."""
    from mp_ckpt_case import CASES, train
    shapes = {}
    for name in CASES:
        trainer = train(name, os.path.join(out, name))
        shapes[name] = {p.name: tuple(p.shape) for p in trainer.model.get_parameters()}
    return {"dir": out, "shapes": shapes}


def prepare_sharded_ckpt(out):
    """The one-process reference of the sharded-checkpoint runs (the workers resume its
    step-STOP_AT checkpoint)."""
    import io
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from trainer_case import trainer_config
    ms.set_context(mode=ms.PYNATIVE_MODE)
    Trainer(trainer_config(out), out, stream=io.StringIO()).train()
    ckpt = os.path.join(out, "checkpoint")
    return {"out": out, "dir": ckpt,
            "step4": os.path.join(ckpt, f"mindformers_core_step{STOP_AT:08d}.safetensors")}


def _groups():
    from ep_case import CASES as EP_CASES
    from pp_case import CASES as PP_CASES
    from tp_case import MODELS, MUON_CASES
    from tpep_case import CASES as TPEP_CASES
    from eval_layout_case import LAYOUTS as EVAL_LAYOUTS
    from cp_case import cases_of
    from ppdp_case import CASES as PPDP_CASES
    import tp_muon_case
    g = {
        "layouts": Group("layouts", cases=list(LAYOUTS)),
        "dp": Group("dp", prepare_dp, [JobCase("dp", 2, "layout_cases:dp_job",
                                                ("{checkpoint}",))]),
        "fsdp": Group("fsdp", None, [JobCase("fsdp", 2, "layout_cases:fsdp_job")]),
        "ep": Group("ep", None, [
            JobCase("ep2", 2, "ep_worker:main", (list(EP_CASES), 4)),
            JobCase("ep2_edp2", 4, "ep_worker:main", (["adamw"], 8))]),
        "tp": Group("tp", None, [
            JobCase("tp2", 2, "tp_worker:run", ("all", list(MODELS + MUON_CASES))),
            JobCase("tp2_dp2", 4, "tp_worker:run", ("train", ["gpt", "dsv3_muon_deredundency"]))]),
        "tp_muon": Group("tp_muon", None, [
            JobCase("tp_muon2", 2, "tp_muon_worker:main", (list(tp_muon_case.CASES),)),
            JobCase("tp_muon2_dp2", 4, "tp_muon_worker:main", (list(tp_muon_case.CASES_2D),))]),
        "pp": Group("pp", None, [JobCase("pp2", 2, "pp_worker:main", (list(PP_CASES),))]),
        "ppdp": Group("ppdp", None, [JobCase("ppdp", 4, "ppdp_worker:main",
                                             (list(PPDP_CASES),))]),
        "tpep": Group("tpep", None, [JobCase("tpep", 4, "tpep_worker:main",
                                             (list(TPEP_CASES),))]),
        "cp": Group("cp", None, [JobCase("cp", 4, "cp_worker:main")]),
        "cp_train": Group("cp_train", None, [
            JobCase(f"cp_train{w}", w, "cp_train_worker:main", (cases_of(w),)) for w in (2, 4)]),
        "group_comm": Group("group_comm", None, [
            JobCase("group_comm2", 2, "group_comm_worker:main", (GROUP_COMM_ROUNDS,)),
            JobCase("group_comm4", 4, "group_comm_worker:main", (GROUP_COMM_ROUNDS,))]),
        "moe_dp": Group("moe_dp", None, [JobCase("moe_dp", 2, "layout_cases:moe_dp_job")]),
        "sharded_ckpt": Group("sharded_ckpt", prepare_sharded_ckpt, [
            JobCase("sharded_ckpt", 2, "sharded_ckpt_worker:main", (STOP_AT, "{step4}"))]),
        "mp_ckpt": Group("mp_ckpt", prepare_mp_ckpt, [
            JobCase("mp_ckpt", 2, "layout_cases:mp_ckpt_job", ("{dir}",))]),
        "eval_tp": Group("eval_tp", None, [JobCase("eval_tp", 2, "eval_tp_worker:main")]),
        "eval_dp": Group("eval_dp", None, [JobCase("eval_dp", 2, "eval_dp_case:run", (2,))]),
        "eval_layouts": Group("eval_layouts", None, [
            JobCase(f"eval_{name}", EVAL_LAYOUTS[name].workers, "eval_layout_worker:main",
                    (name,))
            for name in EVAL_LAYOUTS]),
    }
    for group in g.values():
        for case in group.cases:
            object.__setattr__(case, "group", group.name)
    return g


def groups():
    """name -> Group, in launch order within each world."""
    return _groups()
