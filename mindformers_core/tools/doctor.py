"""Launch doctor: a hyperparameter launch checklist (docs/tools.md) run against a resolved config.

    verdicts = run_doctor(cfg, reference_batch=None, reference_lr=None, pretraining=True)
    print(format_doctor_table(verdicts)); json.dumps(verdicts_to_json(verdicts))

Each :class:`Verdict` names a checklist ``item``, a ``status`` (PASS | WARN | FAIL), the
``reason`` (the numbers that led to it) and a ``suggestion`` (the value to write). FAIL means
"this run will not work or will not fit" (``--check`` exits 1); WARN is advice, "deviates from
the chapter's recommendation" (``--check`` exits 0, 1 only with ``--strict``). Items, FAIL only
where marked:

    peak_lr               the peak lr is in a plausible pretraining range for the optimizer
    warmup                warmup >= max(1000, 2% of total steps) when pretraining from scratch
                          (fine-tuning / continued pretraining: shorter is fine)
    lr_floor              cosine schedules end at ~10% of the peak (WSD may decay to ~0)
    beta2                 AdamW beta2 ~0.95 for pretraining, not 0.999
    weight_decay          decoupled weight decay ~0.1
    weight_decay_scope    no decay on 1-D / bias / embedding parameters (from the real groups)
    max_norm              global-norm clipping at 1.0 (null = clipping disabled)
    tokens_per_step       global batch x seq_length within the band for the model size
    lr_batch_scaling      peak lr scaled from a reference run (sqrt rule for AdamW/Muon/Lion,
                          linear for SGD): --reference-batch / --reference-lr
    grad_accumulation     global = local x data_parallel x accumulation (shown)
    group_lr_ratios       per-group lr multipliers (muP, decoupled lr, Muon vs AdamW branch)
    optimizer_state       checkpoints keep the optimizer state; a resume keeps it too
    muon_prerequisites    Muon: MLA enabled, no swap, QK-Clip on
    loss_scale            the loss scale fits the dtype (optim/loss_scale_bound.py): FAIL beyond
                          (every step would overflow)
    performance_flags     upstream performance flags that change nothing on this backend
                          (config/compat/parallel_noop.py PERFORMANCE_FLAGS): WARN, saying so
    ns_steps              a written optimizer.ns_steps that a segmented ns_coefficients
                          replaced (as upstream): a WARN naming both
    memory                the per-rank memory estimate fits the device (FAIL above it, WARN
                          above 90%; core/memory_plan.py)

FAILs: ``grad_accumulation`` (the batch does not divide), ``muon_prerequisites`` (Muon without
MLA, or with swap), ``loss_scale`` and ``memory``. The rest, ``warmup`` and
``lr_batch_scaling`` included, WARN at most: the run works, differently from the advice.

``format_doctor_report(cfg, verdicts)`` adds the lr at the key steps of the schedule.
"""
from __future__ import annotations

import math
import warnings
from typing import Dict, List, Optional, Sequence

from ..config import ConfigError, RunConfig, load_config
from ..config.compat.parallel_noop import performance_flag_notes
from ..core.memory_plan import param_counts, plan_memory
from ..core.memory_verdict import format_count, memory_verdict
from .batch_scaling import rule_for_optimizer, scale_lr_for_batch_size

__all__ = ["Verdict", "STATUSES", "run_doctor", "format_doctor_table", "format_doctor_report",
           "verdicts_to_json", "count_model_params", "check_memory", "token_band", "recommended_warmup",
           "add_doctor_arguments", "doctor_from_args"]

STATUSES = ("PASS", "WARN", "FAIL")

#: model size bands -> (min, max) tokens per optimizer step. Seed 003: "effective tokens/step in
#: range [0.5M, 16M] depending on model scale"; a ~100M model sits at a few hundred thousand
#: (the capstone: 524,288, tuned on a 65,536-token probe); GPT-3 175B ran 3.2M, Llama 3 405B 16M.
_TOKEN_BANDS = ((2e8, 65_536, 1_048_576), (1e9, 262_144, 2_097_152), (1e10, 524_288, 4_194_304),
                (1e11, 1_048_576, 8_388_608), (math.inf, 2_097_152, 16_777_216))
#: peak-lr bands for pretraining from scratch (AdamW: 6e-4 at 125M .. 1.5e-4 at 70B, tiny
#: models up to ~1e-2; Lion runs 3-10x lower; Muon ~0.02 on its matrices)
_PEAK_LR_BANDS = {"AdamW": (5e-5, 1e-2), "Lion": (1e-5, 3e-3), "Muon": (1e-4, 0.1)}
_TYPICAL_PEAK_LR = {"AdamW": "3.e-4 (AdamW, ~100M-7B models)", "Lion": "1.e-4",
                    "Muon": "2.e-2 (the capstone's Muon)"}
_COSINE_TYPES = ("CosineWithWarmUpLR", "CosineWithRestartsAndWarmUpLR", "CosineAnnealingLR",
                 "CosineAnnealingWarmRestarts", "cosine", "cosine_with_restarts",
                 "cosine_annealing", "cosine_annealing_warm_restarts")
#: build the real model for the group checks up to this many parameters, else a shrunk twin
_MAX_INSPECT_PARAMS = 5e7


class Verdict(dict):
    """One checklist row. A dict (``item``, ``status``, ``reason``, ``suggestion``) so that it
    serialises as JSON as is; the fields are also attributes."""

    def __init__(self, item: str, status: str, reason: str, suggestion: str = ""):
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        super().__init__(item=item, status=status, reason=reason, suggestion=suggestion)

    item = property(lambda self: self["item"])
    status = property(lambda self: self["status"])
    reason = property(lambda self: self["reason"])
    suggestion = property(lambda self: self["suggestion"])


# ----------------------------------------------------------------------------------------------
# model size (analytic: works for presets far too large to build on a CPU)
# ----------------------------------------------------------------------------------------------
def count_model_params(model_cfg) -> int:
    """Trainable parameters of ``build_model(model_cfg)`` without building it
    (core/memory_plan.py ``param_counts``, which also splits them for a layout)."""
    return param_counts(model_cfg).total


def check_memory(cfg, world_size: Optional[int] = None) -> Verdict:
    """Per-rank memory estimate against the device (core/memory_plan.py)."""
    try:
        plan = plan_memory(cfg, world_size)
    except (ConfigError, ValueError) as exc:
        return Verdict("memory", "WARN", f"no memory estimate: {exc}")
    return Verdict("memory", *memory_verdict(plan, cfg))


def token_band(n_params: float):
    """(lo, hi) tokens per step recommended for a model of ``n_params`` parameters."""
    for limit, lo, hi in _TOKEN_BANDS:
        if n_params < limit:
            return lo, hi
    return _TOKEN_BANDS[-1][1:]  # pragma: no cover - the last band is unbounded


def recommended_warmup(total_steps: int) -> int:
    """max(1000, 2% of total) steps (the usual pretraining warmup heuristic), 2% rounded up."""
    return max(1000, math.ceil(0.02 * total_steps))


# ----------------------------------------------------------------------------------------------
# individual checks: each returns one Verdict
# ----------------------------------------------------------------------------------------------
def check_peak_lr(cfg, sched, pretraining: bool) -> Verdict:
    opt, peak = cfg.optimizer.type, sched.peak_lr
    band = _PEAK_LR_BANDS.get(opt)
    if not pretraining or band is None:
        why = "fine-tuning" if not pretraining else f"no reference range for {opt}"
        return Verdict("peak_lr", "PASS", f"peak lr {peak:.3g} ({why})")
    lo, hi = band
    if lo <= peak <= hi:
        return Verdict("peak_lr", "PASS", f"peak lr {peak:.3g} within [{lo:g}, {hi:g}] for "
                                          f"{opt} pretraining")
    side = "below" if peak < lo else "above"
    hint = " (1e-5 is MindFormers' fine-tuning default)" if peak < lo else ""
    return Verdict("peak_lr", "WARN",
                   f"peak lr {peak:.3g} is {side} the usual {opt} pretraining range "
                   f"[{lo:g}, {hi:g}]{hint}; tune it on a proxy (muP) sweep",
                   f"learning_rate: {_TYPICAL_PEAK_LR[opt]} or your proxy-sweep value")


def check_warmup(cfg, plan, pretraining: bool) -> Verdict:
    total, warm = plan.total_steps, plan.warmup_steps
    need = recommended_warmup(total)
    if not pretraining:
        return Verdict("warmup", "PASS", f"warmup {warm} steps: fine-tuning / continued "
                                         "pretraining needs only a short warmup (100-500 steps)")
    if warm >= need:
        return Verdict("warmup", "PASS", f"warmup {warm} steps >= max(1000, 2% of {total}) = "
                                         f"{need}")
    # advice, never a FAIL: the run works (upstream accepts it, and its own configs run
    # without warmup); Muon's orthogonalised updates have a fixed RMS and tolerate it best
    # (docs/muon.md), and a run shorter than the thousand steps in which a missing warmup
    # diverges is a smoke test
    status = "WARN"
    reason = (f"warmup {warm} steps < max(1000, 2% of {total} steps) = {need}: pretraining "
              "from scratch with a short warmup risks early loss spikes / divergence")
    if warm == 0:
        reason = (f"no warmup: pretraining from scratch without warmup frequently diverges in "
                  f"the first thousand steps (want >= {need})")
    suggestion = f"warmup_steps: {need}"
    if need >= total:
        suggestion += (f" (the run has only {total} steps: lengthen it; a fine-tuning run "
                       "is checked with pretraining=False / --fine-tuning)")
    else:
        suggestion += f" (or warmup_ratio: {need / total:.4g})"
    return Verdict("warmup", status, reason, suggestion)


def check_lr_floor(cfg, sched, plan) -> Verdict:
    kind = cfg.lr_scheduler.type
    peak = sched.peak_lr
    if kind not in _COSINE_TYPES:
        return Verdict("lr_floor", "PASS", f"{kind}: the 10%-of-peak floor rule is for cosine "
                                           "(WSD decays to ~0 by design)")
    p = cfg.lr_scheduler.params
    floor = float(p.get("eta_min", p.get("lr_end", 0.0)) or 0.0)
    frac = floor / peak if peak > 0 else 0.0
    if 0.05 <= frac <= 0.2:
        status, reason = "PASS", f"cosine floor {floor:.3g} = {frac:.0%} of peak {peak:.3g}"
    else:
        status = "WARN"
        reason = (f"cosine floor {floor:.3g} is {frac:.1%} of the peak {peak:.3g}; the chapter "
                  "decays cosine to ~10% of the peak")
    name = "eta_min" if "eta_min" in p else "lr_end"
    final = sched.lr_at(max(0, plan.total_steps - 1))
    if kind in ("CosineWithWarmUpLR", "cosine") and final > floor + 0.05 * (peak - floor):
        status = "WARN"
        reason += (f"; the decay does not finish at the floor (lr at the last step {final:.3g}, "
                   f"num_cycles {p.get('num_cycles')}): use num_cycles 0.5 so it ends at "
                   f"lr_end by step {plan.total_steps}")
    return Verdict("lr_floor", status, reason, "" if status == "PASS" else f"{name}: {0.1 * peak:.3g}")


def check_beta2(cfg, pretraining: bool) -> Verdict:
    opt = cfg.optimizer
    if opt.type == "AdamW":
        field, beta2 = "betas[1]", opt.betas[1]
    elif opt.type == "Muon":
        field, beta2 = "adamw_betas[1]", opt.adamw_betas[1]
    else:
        return Verdict("beta2", "PASS", f"n/a for {opt.type}")
    if 0.9 <= beta2 <= 0.98:
        return Verdict("beta2", "PASS", f"{field} = {beta2:g} (~0.95)")
    if not pretraining and beta2 > 0.98:
        return Verdict("beta2", "PASS", f"{field} = {beta2:g}: acceptable for fine-tuning")
    why = ("adapts slowly to gradient-scale changes (warmup, lr jumps, spikes)" if beta2 > 0.98
           else "a very short second-moment average makes the update noisy")
    return Verdict("beta2", "WARN", f"{field} = {beta2:g} {why}; LLM pretraining uses 0.95",
                   f"optimizer.{'betas' if opt.type == 'AdamW' else 'adamw_betas'}: "
                   f"[{(opt.betas if opt.type == 'AdamW' else opt.adamw_betas)[0]:g}, 0.95]")


def check_weight_decay(cfg) -> Verdict:
    opt = cfg.optimizer
    wd = opt.weight_decay
    if opt.type == "AdamW" and not opt.decoupled_weight_decay:
        return Verdict("weight_decay", "WARN", "decoupled_weight_decay: False runs coupled L2 "
                       "through Adam's denominators, not AdamW's decoupled decay",
                       "optimizer.decoupled_weight_decay: True, weight_decay: 0.1")
    if 0.05 <= wd <= 0.2:
        return Verdict("weight_decay", "PASS", f"decoupled weight_decay {wd:g} (~0.1)")
    what = "disabled" if wd == 0 else ("weak" if wd < 0.05 else "strong")
    return Verdict("weight_decay", "WARN",
                   f"weight_decay {wd:g} is {what}; pretraining uses 0.1 (and lr x wd is the "
                   "real strength: change them together)", "optimizer.weight_decay: 0.1")


def _named_groups(cfg, model):
    """Param groups of the real model (or its shrunk twin), with get_param_groups warnings."""
    from ..optim.param_groups import get_param_groups
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = get_param_groups(model, cfg.optimizer, hidden_size=cfg.model.hidden_size)
    notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    return groups, notes


def check_weight_decay_scope(cfg, groups, notes, twin: bool) -> Verdict:
    decayed_1d, decayed_emb = [], []
    for g in groups:
        eff = float(g.get("weight_decay", 0.0)) * float(g.get("wd_mult", 1.0))
        if eff == 0.0:
            continue
        for p in g["params"]:
            if len(p.shape) <= 1 or p.name.endswith(".bias"):
                decayed_1d.append(p.name)
            elif "word_embeddings" in p.name:
                decayed_emb.append(p.name)
    src = " (checked on a shrunk twin of the model: same names and ranks)" if twin else ""
    tail = ("; notes: " + "; ".join(notes)) if notes else ""
    if decayed_1d:
        shown = ", ".join(decayed_1d[:3]) + (" ..." if len(decayed_1d) > 3 else "")
        return Verdict("weight_decay_scope", "WARN",
                       f"{len(decayed_1d)} 1-D/bias parameters are decayed ({shown}): decay "
                       f"pulls norm gammas and biases to 0{src}{tail}",
                       "remove them from weight_decay_include / rmsnorm_weight_decay_mult / "
                       "param_overrides (1-D and .bias are exempt by default)")
    if decayed_emb:
        return Verdict("weight_decay_scope", "WARN",
                       f"the word embedding is decayed ({', '.join(decayed_emb)}); the chapter "
                       f"excludes embeddings, norms and biases{src}{tail}",
                       'optimizer.weight_decay_exclude: add "*word_embeddings*"')
    return Verdict("weight_decay_scope", "PASS",
                   f"no decay on 1-D/bias/embedding parameters{src}{tail}")


def check_max_norm(cfg) -> Verdict:
    c = cfg.training.max_norm
    if c is None:
        return Verdict("max_norm", "WARN", "max_norm: null disables gradient clipping; a single "
                       "gradient spike then lands in full", "training.max_norm: 1.0")
    if 0.5 <= c <= 2.0:
        return Verdict("max_norm", "PASS", f"global-norm clipping at {c:g} (~1.0)")
    how = "clips almost every step (it becomes a fixed-norm update)" if c < 0.5 \
        else "rarely clips: spikes pass through"
    return Verdict("max_norm", "WARN", f"max_norm {c:g} {how}; the chapter clips at 1.0 and "
                   "expects < ~20% of steps to hit it", "training.max_norm: 1.0")


def check_tokens_per_step(cfg, plan, n_params: int) -> Verdict:
    tokens = plan.tokens_per_step
    lo, hi = token_band(n_params)
    desc = (f"{format_count(tokens)} tokens/step (global_batch_size {plan.global_batch_size} x "
            f"seq_length {plan.seq_length}) for a {format_count(n_params)}-parameter model")
    if lo <= tokens <= hi:
        return Verdict("tokens_per_step", "PASS", f"{desc}: within [{format_count(lo)}, "
                                                  f"{format_count(hi)}]")
    target = lo if tokens < lo else hi
    gbs = max(1, round(target / plan.seq_length))
    side = "below" if tokens < lo else "above"
    return Verdict("tokens_per_step", "WARN",
                   f"{desc}: {side} the band [{format_count(lo)}, {format_count(hi)}] for this "
                   "size; check it against the measured critical batch (tools.noise_scale)",
                   f"training.global_batch_size: ~{gbs} (then rescale the lr: sqrt rule)")


def check_lr_batch_scaling(cfg, plan, sched, reference_batch, reference_lr) -> Verdict:
    if reference_batch is None and reference_lr is None:
        return Verdict("lr_batch_scaling", "PASS", "no reference run given "
                       "(--reference-batch/--reference-lr): nothing to compare")
    if reference_batch is None or reference_lr is None:
        return Verdict("lr_batch_scaling", "WARN", "give both --reference-batch and "
                       "--reference-lr (the reference run's global batch and peak lr)")
    try:
        rule = rule_for_optimizer(cfg.optimizer.type)
        want = scale_lr_for_batch_size(reference_lr, reference_batch, plan.global_batch_size,
                                       rule)
    except ValueError as exc:
        # the comparison cannot be made (e.g. a reference batch <= 0): the run itself is fine
        return Verdict("lr_batch_scaling", "WARN", f"no comparison: {exc}")
    have = sched.peak_lr
    desc = (f"reference lr {reference_lr:.3g} at batch {reference_batch:g} -> batch "
            f"{plan.global_batch_size} ({rule} rule, {cfg.optimizer.type}) wants {want:.3g}; "
            f"configured {have:.3g}")
    ratio = have / want if want > 0 else math.inf
    if 0.8 <= ratio <= 1.25:
        return Verdict("lr_batch_scaling", "PASS", desc)
    other = "linear" if rule == "sqrt" else "sqrt"
    alt = scale_lr_for_batch_size(reference_lr, reference_batch, plan.global_batch_size, other)
    if alt > 0 and 0.95 <= have / alt <= 1.05 and reference_batch != plan.global_batch_size:
        desc += f" -- that is the {other} rule, wrong for {cfg.optimizer.type}"
    elif reference_batch != plan.global_batch_size and 0.95 <= have / reference_lr <= 1.05:
        desc += " -- the lr was not rescaled for the batch change"
    if not 0.5 <= ratio <= 2.0:
        desc += " (more than 2x off)"
    return Verdict("lr_batch_scaling", "WARN", desc, f"learning_rate: {want:.3g}")


def check_grad_accumulation(cfg, world_size) -> Verdict:
    tr = cfg.training
    try:
        plan = cfg.plan(world_size)
    except ConfigError as exc:
        return Verdict("grad_accumulation", "FAIL", str(exc),
                       "make global_batch_size a multiple of local_batch_size x data_parallel")
    return Verdict("grad_accumulation", "PASS",
                   f"global_batch_size {tr.global_batch_size} = local_batch_size "
                   f"{tr.local_batch_size} x data_parallel {plan.data_parallel} x accumulation "
                   f"{plan.num_accumulation_steps} (world size {plan.world_size}); the loss is "
                   "token-weighted over the whole step")


def check_group_lr_ratios(cfg, sched, groups) -> Verdict:
    peak = sched.peak_lr
    rows, zero, high = [], [], []
    for i, g in enumerate(groups):
        if "max_lr" in g:
            ratio = g["max_lr"] / peak if peak > 0 else math.inf
        else:
            ratio = float(g.get("lr_mult", 1.0))
        rows.append(f"g{i}[{g.get('name', '')}] x{ratio:.3g}")
        if ratio == 0:
            zero.append(i)
        elif ratio > 10:
            high.append(i)
    desc = "per-group peak lr / base: " + "; ".join(rows)
    opt = cfg.optimizer
    if opt.mup is not None:
        desc += f" (muP width_mult {cfg.model.hidden_size / opt.mup.base_hidden_size:g})"
    if zero:
        return Verdict("group_lr_ratios", "WARN", desc + f"; groups {zero} never train (lr 0)",
                       "remove lr_mult: 0 / max_lr: 0, or freeze those parameters explicitly")
    if high:
        return Verdict("group_lr_ratios", "WARN", desc + f"; groups {high} run > 10x the base lr",
                       "check decoupled_lr / param_overrides lr_mult")
    if opt.type == "Muon" and opt.muon_scale_mode != "spectral" and opt.adamw_lr_mult == 1.0 \
            and peak > 5e-3:
        return Verdict("group_lr_ratios", "WARN",
                       desc + f"; Muon ({opt.muon_scale_mode}) at lr {peak:.3g} also drives its "
                       "AdamW branch (embeddings, head, norms) at that lr; the chapter's hybrid "
                       "runs AdamW ~an order of magnitude lower (0.02 vs 3e-3)",
                       f"optimizer.adamw_lr_mult: {3e-3 / peak:.2g}")
    return Verdict("group_lr_ratios", "PASS", desc + "; ratios are kept on every step and resume")


def check_optimizer_state(cfg) -> Verdict:
    ck = cfg.checkpoint
    if ck.load_path and ck.no_load_optim:
        return Verdict("optimizer_state", "WARN", "resuming with no_load_optim: Adam moments "
                       "restart from zero, which calls for a fresh warmup",
                       "checkpoint.no_load_optim: False (or re-warm the lr)")
    if not ck.enable_save:
        return Verdict("optimizer_state", "PASS", "checkpoints disabled (enable_save: False): "
                       "nothing to save")
    if ck.no_save_optim:
        return Verdict("optimizer_state", "WARN", "no_save_optim: checkpoints lack the optimizer "
                       "state; a resume restarts Adam moments (loss spike, re-warmup needed)",
                       "checkpoint.no_save_optim: False")
    return Verdict("optimizer_state", "PASS", "checkpoints keep optimizer state, per-group lr "
                   "ratios and the step (the lr is a pure function of the step)")


def check_muon_prerequisites(cfg) -> Verdict:
    opt, model = cfg.optimizer, cfg.model
    if opt.type != "Muon":
        return Verdict("muon_prerequisites", "PASS", f"n/a for {opt.type}")
    problems = []
    if not model.resolved_multi_latent_attention():
        problems.append(f"model_type {model.model_type} without Multi-Latent Attention (Muon "
                        "only supports MLA models)")
    if opt.swap:
        problems.append("swap: True (Muon does not support swap)")
    if problems:
        return Verdict("muon_prerequisites", "FAIL", "; ".join(problems),
                       "model.model_type: deepseek_v3 / multi_latent_attention: True; "
                       "optimizer.swap: False")
    if not opt.qk_clip_enabled:
        return Verdict("muon_prerequisites", "WARN", "Muon with QK-Clip disabled: MLA attention "
                       "logits can grow without bound (MuonClip)",
                       "optimizer.qk_clip_enabled: True")
    return Verdict("muon_prerequisites", "PASS",
                   f"MLA enabled ({model.model_type}), no swap, QK-Clip at "
                   f"{opt.qk_clip_threshold:g}")


def check_loss_scale(cfg) -> Verdict:
    from ..optim.loss_scale_bound import loss_scale_problem
    problem = loss_scale_problem(cfg.optimizer, cfg.model)
    if problem is not None:
        field, message = problem
        return Verdict("loss_scale", "FAIL", f"{field}: {message}",
                       f"{field}: {2.0 ** 16:g} (or null for dynamic scaling)")
    static = cfg.optimizer.loss_scale
    return Verdict("loss_scale", "PASS", f"static loss scale {static:g}" if static is not None
                   else "no static loss scale (dynamic under float16, none otherwise)")


def check_performance_flags(cfg) -> Verdict:
    """Upstream performance flags the config turns on that do nothing here (the run is the same
    math either way, so a WARN)."""
    notes = performance_flag_notes(cfg.parallelism)
    if notes:
        return Verdict("performance_flags", "WARN", "; ".join(notes),
                       "remove them, or keep them for the same YAML on Ascend")
    return Verdict("performance_flags", "PASS", "no upstream performance flag that is a no-op "
                                                "here is set")


def check_ns_steps(cfg) -> Verdict:
    """A written ``optimizer.ns_steps`` that a segmented ``ns_coefficients`` replaced (as
    upstream does): the schedule's iterations run, so a WARN naming both."""
    written = cfg.optimizer.replaced_ns_steps()
    if written is not None:
        return Verdict("ns_steps", "WARN",
                       f"optimizer.ns_steps is {written}, but the segmented ns_coefficients "
                       f"runs {cfg.optimizer.ns_steps} Newton-Schulz iterations (its counts); "
                       f"those run, as upstream", f"set ns_steps: {cfg.optimizer.ns_steps} or "
                       f"remove it")
    return Verdict("ns_steps", "PASS", "ns_steps agrees with the Newton-Schulz schedule")


# ----------------------------------------------------------------------------------------------
def _shrunk_twin_config(model_cfg):
    """Same structure (names, ranks, layer kinds), tiny sizes: for group checks of big models."""
    import dataclasses
    # the canonical fields (to_dict() may hold the user's upstream spelling of some)
    d = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(model_cfg)}
    d.update(vocab_size=256, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128,
             num_query_groups=None if model_cfg.num_query_groups is None else 2,
             kv_channels=None if model_cfg.kv_channels is None else 16,
             q_lora_rank=None if model_cfg.q_lora_rank is None else 32, kv_lora_rank=32,
             qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, moe_intermediate_size=64,
             n_routed_experts=min(model_cfg.n_routed_experts, 4),
             num_experts_per_tok=min(model_cfg.num_experts_per_tok, 2),
             num_layers=min(model_cfg.num_layers, 2 if model_cfg.model_type != "deepseek_v3"
                            else model_cfg.first_k_dense_replace + 1),
             params_dtype="float32", compute_dtype="float32")
    d["first_k_dense_replace"] = min(model_cfg.first_k_dense_replace, d["num_layers"])
    twin = type(model_cfg)(**d)
    twin.validate("model")
    return twin


def run_doctor(cfg, reference_batch: Optional[float] = None,
               reference_lr: Optional[float] = None, pretraining: bool = True, *,
               model=None, world_size: Optional[int] = None,
               inspect_model: bool = True) -> List[Verdict]:
    """Evaluate the launch checklist; returns one :class:`Verdict` per item (module docstring).

    ``cfg``: a RunConfig, a config dict or a YAML path. ``model``: an already built model for
    the group checks; otherwise it is built (a shrunk twin above ~50M parameters) unless
    ``inspect_model`` is False, which skips the two group-based items (imports no MindSpore).
    ``world_size``: check the batch arithmetic for that many devices (default: the launcher's).
    """
    if not isinstance(cfg, RunConfig):
        cfg = load_config(cfg)
    sched = cfg.build_lr_scheduler()
    plan = cfg.plan()
    n_params = count_model_params(cfg.model)
    verdicts = [
        check_peak_lr(cfg, sched, pretraining),
        check_warmup(cfg, plan, pretraining),
        check_lr_floor(cfg, sched, plan),
        check_beta2(cfg, pretraining),
        check_weight_decay(cfg),
    ]
    if inspect_model:
        twin = False
        if model is None:
            from ..models import build_model
            twin = n_params > _MAX_INSPECT_PARAMS
            model = build_model(_shrunk_twin_config(cfg.model) if twin else cfg.model, seed=0)
        groups, notes = _named_groups(cfg, model)
        verdicts.append(check_weight_decay_scope(cfg, groups, notes, twin))
    verdicts += [
        check_max_norm(cfg),
        check_tokens_per_step(cfg, plan, n_params),
        check_lr_batch_scaling(cfg, plan, sched, reference_batch, reference_lr),
        check_grad_accumulation(cfg, world_size),
    ]
    if inspect_model:
        verdicts.append(check_group_lr_ratios(cfg, sched, groups))
    verdicts += [check_optimizer_state(cfg), check_muon_prerequisites(cfg),
                 check_loss_scale(cfg), check_performance_flags(cfg), check_ns_steps(cfg)]
    verdicts.append(check_memory(cfg, world_size))
    return verdicts


def verdicts_to_json(verdicts: Sequence[Verdict]) -> List[Dict[str, str]]:
    """Plain dicts ``{item, status, reason, suggestion}`` in checklist order."""
    return [{k: v[k] for k in ("item", "status", "reason", "suggestion")} for v in verdicts]


def format_doctor_table(verdicts: Sequence[Verdict]) -> str:
    """``STATUS  item  reason  -> suggestion`` per row, then the counts."""
    width = max((len(v.item) for v in verdicts), default=4)
    lines = ["launch doctor (hyperparameter launch checklist)"]
    for v in verdicts:
        line = f"[{v.status}] {v.item.ljust(width)}  {v.reason}"
        if v.suggestion:
            line += f"\n       {' ' * width}  -> suggest {v.suggestion}"
        lines.append(line)
    counts = {s: sum(v.status == s for v in verdicts) for s in STATUSES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


def format_doctor_report(cfg, verdicts: Sequence[Verdict]) -> str:
    """The table plus the lr at the key steps of the schedule (tools.plot_lr)."""
    from .plot_lr import lr_table
    sched = cfg.build_lr_scheduler()
    return format_doctor_table(verdicts) + "\n\nlr at key steps:\n" + \
        lr_table(sched, cfg.training.steps)


# ----------------------------------------------------------------------------------------------
# command-line glue for run_mindformer.py --check
# ----------------------------------------------------------------------------------------------
def add_doctor_arguments(parser) -> None:
    """The doctor's flags: --reference-batch, --reference-lr, --fine-tuning."""
    parser.add_argument("--reference-batch", dest="reference_batch", type=float, default=None,
                        help="doctor: global batch size of a reference run (same unit as "
                             "training.global_batch_size)")
    parser.add_argument("--reference-lr", dest="reference_lr", type=float, default=None,
                        help="doctor: peak lr of that reference run")
    parser.add_argument("--fine-tuning", dest="fine_tuning", action="store_true",
                        help="doctor: the run starts from trained weights (short warmup and "
                             "beta2 0.999 are fine)")


def doctor_from_args(cfg, args, inspect_model: bool = True) -> List[Verdict]:
    """``run_doctor`` with the flags of :func:`add_doctor_arguments` (missing flags = defaults).
    ``inspect_model=False`` keeps MindSpore out (the two group-based items are skipped)."""
    return run_doctor(cfg, reference_batch=getattr(args, "reference_batch", None),
                      reference_lr=getattr(args, "reference_lr", None),
                      pretraining=not getattr(args, "fine_tuning", False),
                      inspect_model=inspect_model)
