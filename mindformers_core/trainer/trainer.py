"""The PyNative training loop.

One optimizer step (docs/architecture.md "Trainer"; differences from upstream in
docs/differences.md):

1. ``num_micro`` micro-batches (``global_batch // (local_batch * dp)``; from the batch ramp
   when ``rampup_batch_size`` is set), their loss tokens counted first (and summed over ranks);
2. forward + backward per micro-batch with ``loss_sum_j / T + aux_j / N`` (``accumulate.py``),
   times the loss scale under fp16 / static loss scaling; fp32 gradients summed;
3. ``parallel.reduce`` (identity on one process; the layout's reduction under msrun:
   distributed/setup.py ``ParallelRun``);
4. unscale; global L2 norm in fp32 (the logged, pre-clip norm);
5. skip when the norm is non-finite (``use_skip_step_on_nan``, upstream messages; a dynamic
   loss scaler skips on overflow by itself), or above ``optimizer.grad_norm_skip_threshold``;
   without ``use_skip_step_on_nan`` a non-finite norm stops the run (never applied silently);
6. clip: ``coef = max_norm / (norm + 1e-6)``, applied when ``coef < 1``;
7. per-group lr ``group_lrs(sched, opt.param_groups, k)`` with ``k`` the number of updates
   applied so far (a skipped step does not advance the lr); the lr logged for step k is the
   lr applied at step k (upstream logs the next one);
8. ``opt.step(grads)`` (Muon runs QK-Clip in it) and
   ``model.update_expert_bias()`` when they exist;
9. log, checkpoint every ``save_interleaved_steps``; stop requests (SIGTERM/SIGINT) and
   ``training.stop_at_step`` end the run after a complete step with a checkpoint.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from ..config.checkpoint import CheckpointConfig
from ..errors import ConfigError
from ..core.memory_plan import plan_memory
from ..core.memory_verdict import format_memory_plan
from ..optim.host.seam import host_kernels
from .accumulate import accumulate_gradients, count_loss_tokens, make_grad_fn
from ..checkpoint.store import (CheckpointData, CheckpointError, checkpoint_name, list_checkpoints,
                         prune_checkpoints, save_checkpoint)
from .config_diff import config_changes
from .metrics import MetricsWriter, StepMetrics
from ..checkpoint.async_writer import AsyncCheckpointWriter, snapshot
from ..checkpoint.lineage import start_lineage
from ..checkpoint.foreign import resolve_start
from .monitor import TrainStateMonitor
from .payload import jsonable, state_arrays, tensor_to_numpy
from .moe_metrics import log_due, moe_step_stats
from .preflight import estimate_checkpoint_bytes, preflight_run_dirs
from .profiler import StepProfiler
from .rampup import build_batch_ramp
from ..checkpoint.resume_checks import (check_train_payload, lr_jump_warning,
                            optimizer_tensor_names)
from .rng import capture_rng_state, restore_rng_state, seed_everything
from .protocols import ExpertBiasModel, MaxLogitsModel, MoEStatsModel, QKClipOptimizer
from .run_dir import claim_run_dir, new_run_id, release_run_dir
from ..checkpoint.sharded_save import load_options, reshard_for_model, save_sharded, uses_sharded_checkpoint
from .signals import StopRequest
from .step_decision import NONFINITE, OVERFLOW, SKIP_LIMIT, THRESHOLD, decide_step
from ..checkpoint.train_state import TrainState

__all__ = ["Trainer", "SKIP_WARNING", "SKIP_LIMIT_ERROR", "NONFINITE_ERROR"]

SKIP_WARNING = ("[SkipStepOnNaN] Global gradient norm is %s at step %d, skipping the optimizer "
                "update (consecutive skipped: %d, total skipped: %d).")
SKIP_LIMIT_ERROR = ("[SkipStepOnNaN] The global gradient norm has been {what} for {n} "
                    "consecutive steps, which reaches training.max_consecutive_skipped_steps={m}. "
                    "Training is making no progress; check the data, the learning rate and the "
                    "model configuration.")
NONFINITE_ERROR = ("global gradient norm is {norm} at step {step}; the update was not applied. "
                   "Set training.use_skip_step_on_nan: True to skip such steps, and check the "
                   "data, the learning rate and the model configuration.")
THRESHOLD_WARNING = ("[SkipStep] Global gradient norm %.6g exceeds optimizer.grad_norm_skip_"
                     "threshold=%g at step %d, skipping the optimizer update "
                     "(consecutive skipped: %d, total skipped: %d).")


class Trainer:
    """``Trainer(cfg, output_dir).train()``.

    ``model``, ``optimizer``, ``dataset``, ``lr_scheduler``, ``plan`` and ``parallel`` default
    to the ones the config builds (``parallel``: ``distributed.setup.setup_parallel(cfg)``, this
    process's part of the layout); passing them in is for tests. ``grad_hooks``: callables
    ``hook(step, grads) -> grads`` run on the reduced, unscaled gradients before the norm
    (fault injection in tests, gradient monitors).
    """

    def __init__(self, cfg, output_dir: Optional[str] = None, *, model=None, optimizer=None,
                 dataset=None, lr_scheduler=None, parallel=None, stream=None,
                 eval_dataset=None, plan=None,
                 world_size: Optional[int] = None, rank: Optional[int] = None,
                 pynative_synchronize: Optional[bool] = None, overwrite: bool = False):
        from .pynative import choose_pynative_synchronize, apply_pynative_synchronize
        apply_pynative_synchronize(choose_pynative_synchronize(cfg)
                                   if pynative_synchronize is None else pynative_synchronize)
        self.cfg = cfg
        self.output_dir = output_dir
        # this process's part of the layout (distributed/setup.py): one object for every
        # layout, single process included (communication is initialised only under msrun)
        if parallel is None:
            from ..distributed.setup import setup_parallel
            parallel = setup_parallel(cfg)
        self.parallel = parallel
        ws = self.parallel.world_size if world_size is None else world_size
        self.rank = self.parallel.rank if rank is None else rank
        self.data_rank = self.parallel.data_rank
        self.plan = cfg.plan(ws) if plan is None else plan
        tr = cfg.training
        self.ckpt_cfg: CheckpointConfig = cfg.checkpoint
        self.grad_hooks: List[Callable] = []
        self.state = TrainState()
        self.writer = MetricsWriter(output_dir, stream=stream or sys.stdout,
                                    enabled=self.rank == 0, log_interval=tr.log_interval)
        self.total_steps = int(tr.steps)
        self.stop_at_step = tr.stop_at_step
        self.ramp = build_batch_ramp(tr.rampup_batch_size, tr.global_batch_size,
                                     tr.local_batch_size, self.plan.data_parallel)

        seed_everything(tr.seed, tr.deterministic)
        loaded = self._resolve_resume()
        if loaded is not None and not loaded.weights_only:
            check_train_payload(loaded, self.total_steps)
        # the run lineage: kept by a resume, new for a run from scratch (trainer/run_dir.py)
        self.run_id = (loaded.run_id if loaded is not None and loaded.run_id else new_run_id())
        self.writer.run_id = self.run_id
        self.lineage = start_lineage(new_run_id(), loaded)   # checkpoint/lineage.py
        if self.rank == 0:
            claim_run_dir(output_dir, self.save_dir, self.run_id, loaded is not None, overwrite)

        # muP: the model's half (hidden init std / sqrt(w), logits x 1/w); the optimizer's half
        # (per-group lr / eps) comes from optimizer.mup in build_optimizer
        self.mup_width_mult: Optional[float] = None
        if cfg.optimizer.mup is not None:
            from ..optim.mup import mup_width_mult
            self.mup_width_mult = mup_width_mult(cfg.model.hidden_size, cfg.optimizer.mup)
        from ..data.tokenizer import load_run_tokenizer
        from ..data.run_data import run_documents
        tokenizer = load_run_tokenizer(cfg)
        if model is None:
            from ..models import build_model
            model = build_model(cfg.model, seed=tr.seed, mup_width_mult=self.mup_width_mult,
                                jit=cfg.model_jit_mode(),
                                documents=run_documents(cfg.train_dataset, tokenizer))
            model.set_recompute(cfg.recompute_layers(),   # recompute: (config/recompute.py)
                                cfg.recompute_modules())
            # this rank's part of the seeded model: every builder of the layout, in the one
            # order parallelize() owns (TP/SP slices, FSDP units, the EP cut)
            model = self.parallel.parallelize(model)
        self.model = model
        if loaded is not None:   # [sharded checkpoint hook] after every cut (tp, fsdp, ep):
            loaded = reshard_for_model(loaded, self.model, self.parallel)   # this rank's
            self._load_model(loaded)                                           # shards
        self.parallel.attach(self.model)   # pipeline: frees the other stages' weights
        if lr_scheduler is None:
            lr_scheduler = cfg.build_lr_scheduler()
        self.lr_scheduler = lr_scheduler
        # built sharded (ZeRO-1 per parallelism.data_parallel_shard, TP shards, QK-Clip MAX)
        # before any optimizer state is loaded; an optimizer passed in is used as it is (its
        # caller builds it with shard_layout=parallel.optimizer_sharding())
        if optimizer is None:
            from ..optim import build_optimizer
            optimizer = build_optimizer(cfg.optimizer, self.model, lr_scheduler=lr_scheduler,
                                        shard_layout=self.parallel.optimizer_sharding())
        self.optimizer = optimizer
        self.parallel.bind_optimizer(self.optimizer)
        self.monitor = TrainStateMonitor(cfg.monitor.train_state,
                                         [p.name for p in self.optimizer.parameters])
        self.profiler = StepProfiler(cfg.profiler, output_dir, self.rank)
        self.async_writer = AsyncCheckpointWriter()
        self.loss_scaler = self._build_loss_scaler()
        if self.rank == 0:   # writable directories and room for one checkpoint, before step 1
            preflight_run_dirs(output_dir, self.save_dir, bool(self.ckpt_cfg.save_path),
                               estimate_checkpoint_bytes(
                                   self.parameter_sizes().values(),
                                   not self.ckpt_cfg.no_save_optim), self.ckpt_cfg.enable_save)
        if dataset is None:
            from ..data.run_data import build_run_datasets
            dataset, eval_dataset = build_run_datasets(cfg, self.data_rank,
                                                       self.plan.data_parallel, tokenizer)
        self.dataset = dataset
        from .progress import RunProgress
        self.progress = RunProgress(self, eval_dataset, tokenizer)
        self.entropy_floor = dataset.entropy_floor   # trainer.protocols.TrainData
        self._grad_fn = make_grad_fn(self.model, self.optimizer.parameters)
        self.resumed_from: Optional[str] = None
        if loaded is not None:
            self._load_rest(loaded)

    # ------------------------------------------------------------------ setup helpers
    def parameter_sizes(self) -> Dict[str, int]:
        """name -> element count of the model's parameters (a pipeline rank: every stage's,
        though it holds only its own)."""
        return self.parallel.parameter_sizes(self.model)

    def log(self, text: str) -> None:
        self.writer.message(text)

    def _build_loss_scaler(self):
        """Static scale when ``optimizer.loss_scale`` is set (any dtype), dynamic when the
        model's params or compute dtype is float16, else none (fp32/bf16 need no scaling)."""
        opt_cfg = self.cfg.optimizer
        fp16 = "float16" in (self.cfg.model.params_dtype, self.cfg.model.compute_dtype)
        if opt_cfg.loss_scale is None and not fp16:
            return None
        from ..optim.loss_scale_bound import loss_scale_problem
        problem = loss_scale_problem(opt_cfg, self.cfg.model)
        if problem is not None:
            raise ConfigError(*problem)
        from ..optim.loss_scaler import build_loss_scaler
        return build_loss_scaler(opt_cfg)

    @property
    def dynamic_loss_scaling(self) -> bool:
        if self.loss_scaler is None:
            return False
        from ..optim.loss_scaler import DynamicLossScaler
        return isinstance(self.loss_scaler, DynamicLossScaler)

    @property
    def save_dir(self) -> str:
        if self.ckpt_cfg.save_path:
            return self.ckpt_cfg.save_path
        return os.path.join(self.output_dir or ".", "checkpoint")

    def _resolve_resume(self) -> Optional[CheckpointData]:
        path = self.ckpt_cfg.load_path
        if not path:
            return None
        data = resolve_start(path, self.ckpt_cfg.load_format, self.cfg.model,  # foreign.py
                             log=self.log, **load_options(   # [checkpoint: load_*]
                                 self.ckpt_cfg, self.parallel.group_comm))
        if data.weights_only:   # weights of another format: a fine-tune start, no train state
            return data
        if data.skipped:   # repeated in the final summary, not only in the start-up warning
            self.writer.notes.append(f"WARNING: resumed from {data.path}, skipping "
                                     f"{len(data.skipped)} unusable newer checkpoint(s): "
                                     + "; ".join(data.skipped))
        changes = config_changes(data.config, self.cfg.to_dict())
        if changes:
            self.log(f"resuming from {data.path} with a changed config ({len(changes)} "
                     "field(s)):\n  " + "\n  ".join(changes))
        return data

    def _load_model(self, data: CheckpointData) -> None:
        from ..checkpoint.weights import load_model_weights
        load_model_weights(self.model, data)

    def _load_rest(self, data: CheckpointData) -> None:
        if data.weights_only:
            self.log(f"initialised the model from the weights of {data.path}: a fine-tune start "
                     "(step 0, a fresh optimizer; checkpoint.load_format)")
            return
        try:
            self._restore_state(data)
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            # a state the digest vouches for but this run cannot take (a crafted or foreign
            # file): one clear line instead of a traceback from deep inside a load_state_dict
            raise CheckpointError(f"checkpoint {data.path} cannot be resumed: "
                                  f"{type(exc).__name__}: {str(exc)[:300]}") from None

    def _restore_state(self, data: CheckpointData) -> None:
        st = data.state
        self.state = TrainState.from_dict(st["train_state"])
        self.writer.last_lr = st.get("last_lr")
        if not self.ckpt_cfg.no_load_optim:
            if not st.get("has_optimizer", False):
                raise CheckpointError(
                    f"checkpoint {data.path} was saved with checkpoint.no_save_optim: True; set "
                    "checkpoint.no_load_optim: True to start a fresh optimizer from its weights")
            sd = dict(st.get("optimizer_scalars", {}))
            sd.update({k[len("optim."):]: v for k, v in data.tensors.items()
                       if k.startswith("optim.")})
            self.optimizer.load_state_dict(sd)
        if self.loss_scaler is not None and st.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(st["loss_scaler"])
        if st.get("data") is not None:
            self.dataset.load_state_dict(st["data"])
        rng_arrays = {k[len("rng."):]: v for k, v in data.tensors.items() if k.startswith("rng.")}
        restore_rng_state(st["rng"], rng_arrays)
        self.resumed_from = data.path
        from ..core.lr import group_lrs
        jump = lr_jump_warning(st.get("last_lr"), float(group_lrs(
            self.lr_scheduler, self.optimizer.param_groups, self.state.applied_steps)[0]),
            self.state.step)
        if jump:
            self.log(jump)
        self.log(f"resumed from {data.path}: step {self.state.step}, consumed samples "
                 f"{self.state.consumed_samples}"
                 + (" (optimizer state not loaded)" if self.ckpt_cfg.no_load_optim else ""))

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_payload(self, optimizer_state=None):
        """(tensors, dtypes, state) of the current run, as saved (``optimizer_state``: a
        sharded checkpoint's local optimizer state instead of ``state_dict()``)."""
        tensors, dtypes = {}, {}
        for param in self.model.get_parameters():
            arr, orig = tensor_to_numpy(param)
            tensors[f"model.{param.name}"] = arr
            if orig:
                dtypes[f"model.{param.name}"] = orig
        state = {"train_state": self.state.to_dict(), "has_optimizer": False}
        if not self.ckpt_cfg.no_save_optim:
            sd = self.optimizer.state_dict() if optimizer_state is None else optimizer_state
            arrays, scalars = state_arrays(sd)
            tensors.update({f"optim.{key}": value for key, value in arrays.items()})
            state["optimizer_scalars"] = jsonable(scalars)
            state["optimizer_tensors"] = optimizer_tensor_names(tensors)
            state["has_optimizer"] = True
        state["last_lr"] = self.writer.last_lr
        rng_json, rng_arrays = capture_rng_state()
        state["rng"] = rng_json
        tensors.update({f"rng.{k}": v for k, v in rng_arrays.items()})
        state["data"] = jsonable(self.dataset.state_dict())
        state["loss_scaler"] = (jsonable(self.loss_scaler.state_dict())
                                if self.loss_scaler is not None else None)
        return tensors, dtypes, state

    def save(self, write_hook=None) -> Optional[str]:
        """Write a checkpoint of the current step (rank 0) and prune to ``save_max``."""
        # a pipeline gathers every stage's whole entries on rank 0 (ZeRO-1 state included)
        if not self.parallel.collective_checkpoint and uses_sharded_checkpoint(
                self.model, self.optimizer, not self.ckpt_cfg.no_save_optim):
            return save_sharded(self, write_hook)   # every rank its part (sharded_save.py)
        # a sharded optimizer's state_dict is a collective: every rank gathers, rank 0 writes
        collective = (self.optimizer.collective_state_dict and not self.ckpt_cfg.no_save_optim) or self.parallel.collective_checkpoint
        if self.rank != 0 and not collective:
            return None
        tensors, dtypes, state = self.checkpoint_payload()
        # pipeline: every stage's weights and optimizer state on rank 0
        tensors, state = self.parallel.gather_checkpoint(tensors, state)
        if self.rank != 0:
            return None
        step, config = self.state.step, self.cfg.to_dict()
        if self.ckpt_cfg.async_save:
            tensors = snapshot(tensors)   # later steps must not change what is written

        def write():
            path = save_checkpoint(self.save_dir, self.ckpt_cfg.prefix, step, tensors, state,
                                   config, dtypes, write_hook=write_hook, run_id=self.run_id,
                                   lineage=self.lineage)
            prune_checkpoints(self.save_dir, self.ckpt_cfg.prefix, self.ckpt_cfg.save_max,
                              run_id=self.run_id, protect=self.ckpt_cfg.keep_steps,
                              lineage=self.lineage)
            self.log(f"saved checkpoint {path}")
            return path
        if self.ckpt_cfg.async_save:
            self.async_writer.submit(write)   # checkpoint/async_writer.py
            return os.path.join(self.save_dir, checkpoint_name(self.ckpt_cfg.prefix, step))
        return write()

    # ------------------------------------------------------------------ one step
    def num_micro_batches(self) -> int:
        if self.ramp is not None:
            return self.ramp.num_micro_batches(self.state.consumed_samples)
        return self.plan.num_accumulation_steps

    def fetch_micro_batches(self, num_micro: int) -> List[dict]:
        lbs = self.plan.local_batch_size
        start = self.state.consumed_samples
        return [self.dataset.micro_batch(self.state.step, j, num_micro, lbs, step_start=start)
                for j in range(num_micro)]

    def train_step(self) -> StepMetrics:
        """One optimizer step; updates ``self.state`` and returns its metrics."""
        import mindspore as ms
        from ..core.lr import group_lrs
        from ..optim.clip_grad import clip_by_norm
        from ..models.mtp import step_mtp_loss

        t0 = time.perf_counter()
        tr = self.cfg.training
        step_number = self.state.step + 1
        num_micro = self.num_micro_batches()
        global_batch = num_micro * self.plan.local_batch_size * self.plan.data_parallel
        batches = self.fetch_micro_batches(num_micro)
        local_tokens = count_loss_tokens(batches)
        total_tokens = self.parallel.global_token_count(local_tokens)
        scale = float(self.loss_scaler.scale) if self.loss_scaler is not None else 1.0

        on_micro = (lambda *a: self.monitor.on_micro_batch(*a, loss_scale=scale)
                    ) if self.monitor.watches_micro_batches else None
        def accumulate(micro, tokens, loss_scale, data_parallel):
            return accumulate_gradients(self._grad_fn, micro, tokens, loss_scale,
                                        data_parallel=data_parallel, on_micro=on_micro)
        # a pipeline stage runs its schedule (distributed/pipeline_parallel.py), else the
        # token-weighted accumulation of this rank's micro-batches
        grads, loss_sum, aux = self.parallel.forward_backward(
            accumulate, self.optimizer.parameters, batches, total_tokens, scale)
        self.monitor.on_device_step(loss_sum, local_tokens, grads, loss_scale=scale)
        mtp_loss = step_mtp_loss(self.model)   # inside aux; logged on its own
        mtp_loss = self.parallel.combine_mtp_loss(mtp_loss)   # pipeline: the last stage's
        aux = aux - mtp_loss if mtp_loss is not None else aux
        if mtp_loss is not None:   # logged: the global batch's value (mean over replicas)
            mtp_loss = self.parallel.mean_over_ranks(mtp_loss)
        grads, loss_sum, _ = self.parallel.reduce(grads, loss_sum, local_tokens)
        aux = self.parallel.step_aux(aux)
        moe_stats = moe_step_stats(self.model, self.parallel,   # DP-summed expert loads
                                   log_due(step_number, self.writer.log_interval, self.total_steps))
        if scale != 1.0:
            inv = ms.Tensor(np.float32(1.0 / scale))
            grads = [g * inv for g in grads]
        for hook in self.grad_hooks:
            grads = hook(step_number, grads)
        norm = self.parallel.grad_norm(grads)
        finite = math.isfinite(norm)

        clipped = False
        threshold = self.cfg.optimizer.grad_norm_skip_threshold
        decision = decide_step(norm, max_norm=tr.max_norm, skip_threshold=threshold,
                               dynamic_loss_scaling=self.dynamic_loss_scaling,
                               use_skip_step_on_nan=tr.use_skip_step_on_nan,
                               consecutive_skipped=self.state.consecutive_skipped,
                               max_consecutive_skipped=tr.max_consecutive_skipped_steps)
        skipped = decision.skip is not None
        if decision.error == NONFINITE:
            raise FloatingPointError(NONFINITE_ERROR.format(norm=norm, step=step_number))
        if skipped:
            self.state.total_skipped += 1
            self.state.consecutive_skipped += 1
        if decision.skip == OVERFLOW:   # fp16: the scaler lowers its scale; a normal event
            self.log(f"[LossScaler] gradient overflow at step {step_number} (norm {norm}); "
                     f"skipping the update, loss scale {scale:g} -> "
                     f"{self._update_scaler(True):g}")
        elif decision.skip == NONFINITE:
            self.log(SKIP_WARNING % (norm, step_number, self.state.consecutive_skipped,
                                     self.state.total_skipped))
        elif decision.skip == THRESHOLD:
            self.log(THRESHOLD_WARNING % (norm, threshold, step_number,
                                          self.state.consecutive_skipped, self.state.total_skipped))
        if decision.error == SKIP_LIMIT:
            what = {OVERFLOW: "overflowing the loss scale", NONFINITE: "NaN/Inf",
                    THRESHOLD: f"above optimizer.grad_norm_skip_threshold={threshold:g}"}
            raise RuntimeError(SKIP_LIMIT_ERROR.format(what=what[decision.skip],
                                                       n=self.state.consecutive_skipped,
                                                       m=tr.max_consecutive_skipped_steps))

        lrs = [float(x) for x in group_lrs(self.lr_scheduler, self.optimizer.param_groups,
                                           self.state.applied_steps)]
        num_zeros = None
        qk_stats = None
        if not skipped:
            grads, clipped = clip_by_norm(grads, norm, tr.max_norm)
            if clipped:
                self.state.total_clipped += 1
            if self.cfg.optimizer.log_num_zeros_in_grad:
                num_zeros = int(sum(int((g == 0).sum().asnumpy()) for g in grads))
            self.optimizer.set_group_lrs(lrs)
            self.optimizer.step(grads)
            if isinstance(self.optimizer, QKClipOptimizer):
                # every stage's / tp rank's QK-Clip in one report
                qk_stats = self.parallel.combine_qk_stats(self.optimizer.last_qk_clip)
            if isinstance(self.model, ExpertBiasModel):
                # expert loads were summed over micro-batches and DP ranks once this step
                # (moe_step_stats, after the gradient reduction)
                self.model.update_expert_bias()
            self.state.applied_steps += 1
            self.state.consecutive_skipped = 0
            if self.loss_scaler is not None:
                self._update_scaler(False)
        else:
            if self.loss_scaler is not None and not self.dynamic_loss_scaling:
                self._update_scaler(not finite)   # a static scale stays; kept for symmetry
            # statistics gathered in this step's forward passes must not leak into the next
            # step's expert-bias update / QK-Clip (the update they belong to was skipped)
            if isinstance(self.model, MoEStatsModel):
                self.model.reset_moe_stats()
            if isinstance(self.model, MaxLogitsModel):
                self.model.reset_max_attention_logits()

        self.state.step = step_number
        self.state.consumed_samples += global_batch
        self.state.consumed_tokens += int(total_tokens)
        loss = loss_sum / total_tokens
        step_time = time.perf_counter() - t0
        return StepMetrics(
            step=step_number, total_steps=self.total_steps, loss=loss, lr=lrs[0], lrs=lrs,
            tokens=int(total_tokens),
            grad_norm=norm, tokens_per_s=total_tokens / step_time if step_time > 0 else 0.0,
            step_time_s=step_time, consumed_samples=self.state.consumed_samples,
            global_batch_size=global_batch, clipped=clipped, skipped=skipped,
            excess_loss=(loss - self.entropy_floor) if self.entropy_floor is not None else None,
            loss_scale=scale if self.loss_scaler is not None else None,
            aux_loss=aux if aux else None, mtp_loss=mtp_loss, num_zeros_in_grad=num_zeros,
            qk_clipped_heads=qk_stats.num_clipped_heads if qk_stats is not None else None,
            max_attention_logit=qk_stats.max_logit if qk_stats is not None else None,
            moe=moe_stats,
            extras={k: (v, None) for k, v in self.monitor.pop_records().items()})

    def _update_scaler(self, found_inf: bool) -> float:
        self.loss_scaler.update(found_inf)
        return float(self.loss_scaler.scale)

    # ------------------------------------------------------------------ the run
    def _should_save(self, step: int, end: int) -> bool:
        if not self.ckpt_cfg.enable_save:
            return False
        return (step % self.ckpt_cfg.save_interleaved_steps == 0 or step == end
                or step in (self.ckpt_cfg.keep_steps or ()))

    def train(self, stop_request: Optional[StopRequest] = None) -> str:
        """Run to ``training.steps`` (or ``stop_at_step``, or a stop signal).

        ``stop_request``: an already installed :class:`StopRequest` (``run_training`` installs
        one before building the trainer, so a signal during start-up is honoured too).
        Returns why it ended: ``"finished"``, ``"stopped at step N"`` or ``"interrupted"``.
        """
        end = self.total_steps
        if self.stop_at_step is not None:
            end = min(end, self.stop_at_step)
        self.writer.open(resume_step=self.state.step if self.resumed_from else 0)
        self._write_resolved_config()
        if self.state.step == 0:
            self.log(self.plan.format())
            self.log(format_memory_plan(plan_memory(self.cfg, self.plan.world_size)))
            layout = self.parallel.describe(self.num_micro_batches())
            if layout is not None:
                self.log(layout)
            if self.mup_width_mult is not None:
                self.log(f"muP              : width_mult {self.mup_width_mult:g} (hidden_size "
                         f"{self.cfg.model.hidden_size} / base "
                         f"{self.cfg.optimizer.mup.base_hidden_size}); logits x "
                         f"{1.0 / self.mup_width_mult:g}")
            if self.entropy_floor is not None:
                self.log(f"corpus entropy floor: {self.entropy_floor:.4f} nats/token")
            if host_kernels().describe() is not None:
                self.log(host_kernels().describe())
        self.progress.start()
        reason = "finished"
        last_saved = self.state.step if self.resumed_from else None  # already on disk
        try:
            own = StopRequest(log=self.log) if stop_request is None else None
            with (own if own is not None else contextlib.nullcontext(stop_request)) as stop:
                while self.state.step < end:
                    if stop.requested and self.parallel.world_size == 1:
                        reason = "interrupted"     # signalled before this step started
                        break
                    self.profiler.before_step(self.state.step + 1)
                    metrics = self.train_step()
                    self.profiler.after_step(self.state.step)
                    self.progress.after_step(metrics, end)
                    self.writer.log(metrics, metrics.tokens)
                    self.progress.write_row(metrics.row())
                    if self._should_save(self.state.step, end):
                        self.save()
                        last_saved = self.state.step
                    if self.parallel.broadcast_flag(stop.requested):
                        reason = "interrupted"
                        break
                if reason == "finished" and end < self.total_steps:
                    reason = f"stopped at step {end}"
            # A stop request always saves (preemption must be resumable), even with
            # enable_save False; otherwise the last step is saved when saving is on.
            wants_save = self.ckpt_cfg.enable_save or reason == "interrupted"
            if wants_save and last_saved != self.state.step and self.state.step > 0:
                self.save()
            self.async_writer.wait()   # an async save's failure comes before the summary
            self.writer.summary(self.state, self.entropy_floor, reason)
            self.progress.finish()
        finally:
            self.profiler.close()
            self.async_writer.wait()
            self.writer.close()
            if self.rank == 0:   # the run is over: the directory is free (run_dir.py)
                release_run_dir(self.output_dir, self.save_dir)
        return reason

    def _write_resolved_config(self) -> None:
        if self.output_dir is None or self.rank != 0:
            return
        import yaml
        os.makedirs(self.output_dir, exist_ok=True)
        with open(os.path.join(self.output_dir, "resolved_config.yaml"), "w",
                  encoding="utf-8") as fh:
            yaml.safe_dump(self.cfg.to_dict(), fh, sort_keys=False)
        plan = self.plan.to_dict()
        with open(os.path.join(self.output_dir, "run_plan.yaml"), "w", encoding="utf-8") as fh:
            yaml.safe_dump(jsonable(plan), fh, sort_keys=False)

    def latest_checkpoint(self) -> Optional[str]:
        found = list_checkpoints(self.save_dir)
        return found[-1][1] if found else None
