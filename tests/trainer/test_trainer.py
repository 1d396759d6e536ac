"""End-to-end trainer behaviour on a tiny GPT: resume exactness, accumulation equivalence,
NaN skipping, stop requests, stop_at_step, batch ramp, checkpoints and metrics files."""
import io
import json
import os
import signal

import numpy as np
import pytest

from mindformers_core.config import load_config
from mindformers_core.trainer import Trainer, run_training
from mindformers_core.checkpoint.store import list_checkpoints, load_checkpoint


def tiny_cfg(out, steps=20, **sections):
    data = {
        "training": {"steps": steps, "local_batch_size": 2, "global_batch_size": 4,
                     "max_norm": 1.0, "seed": 7, "deterministic": True},
        "optimizer": {"type": "AdamW", "betas": [0.9, 0.95], "weight_decay": 0.01},
        "lr_scheduler": {"type": "CosineWithWarmUpLR", "learning_rate": 5.e-3,
                         "warmup_steps": min(3, steps), "lr_end": 1.e-4},
        "model": {"model_type": "gpt", "vocab_size": 32, "hidden_size": 16, "num_layers": 1,
                  "num_attention_heads": 2, "seq_length": 8},
        "train_dataset": {"type": "SyntheticMarkov", "loss_mask_mode": "random_prefix"},
        "checkpoint": {"enable_save": True, "save_interleaved_steps": 5, "save_max": 5,
                       "save_path": os.path.join(str(out), "ckpt")},
    }
    for name, values in sections.items():
        data[name].update(values)
    return load_config(data)


def rows(out):
    with open(os.path.join(str(out), "metrics.jsonl")) as fh:
        return [json.loads(x) for x in fh]


def run(cfg, out, hooks=()):
    t = Trainer(cfg, str(out), stream=io.StringIO())
    t.grad_hooks.extend(hooks)
    reason = t.train()
    return t, reason


def final_tensors(t):
    tensors, _, _ = t.checkpoint_payload()
    return {k: v for k, v in tensors.items() if k.startswith(("model.", "optim."))}


def test_resume_is_bit_exact(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    ta, _ = run(tiny_cfg(a), a)
    tb, reason = run(tiny_cfg(b, training={"stop_at_step": 10}), b)
    assert reason == "stopped at step 10"
    assert [s for s, _ in list_checkpoints(str(b / "ckpt"))] == [5, 10]
    cfg_c = tiny_cfg(b, checkpoint={"load_path": str(b / "ckpt")})
    tc, _ = run(cfg_c, b)
    assert tc.resumed_from.endswith("step00000010.safetensors")
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in rb] == list(range(1, 21))
    for x, y in zip(ra, rb):
        assert (x["loss"], x["lr"], x["grad_norm"]) == (y["loss"], y["lr"], y["grad_norm"])
    fa, fc = final_tensors(ta), final_tensors(tc)
    assert sorted(fa) == sorted(fc) and any(k.startswith("optim.main_param.") or
                                            k.startswith("optim.adam_m.") for k in fa)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fc[k], err_msg=k)
    assert ta.state == tc.state


def test_accumulation_equals_one_big_batch(tmp_path):
    """gbs 8 as 4 micro-batches of 2 (unequal token counts) == 1 batch of 8."""
    big = tiny_cfg(tmp_path / "big", steps=3,
                   training={"local_batch_size": 8, "global_batch_size": 8})
    acc = tiny_cfg(tmp_path / "acc", steps=3,
                   training={"local_batch_size": 2, "global_batch_size": 8})
    assert acc.plan(1).num_accumulation_steps == 4
    t_big, _ = run(big, tmp_path / "big")
    t_acc, _ = run(acc, tmp_path / "acc")
    r_big, r_acc = rows(tmp_path / "big"), rows(tmp_path / "acc")
    for x, y in zip(r_big, r_acc):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5)
    for k, v in final_tensors(t_big).items():
        np.testing.assert_allclose(final_tensors(t_acc)[k], v, rtol=1e-4, atol=1e-6, err_msg=k)


def _nan_at(step_to_poison):
    def hook(step, grads):
        if step in step_to_poison:
            grads = list(grads)
            grads[0] = grads[0] * float("nan")
        return grads
    return hook


def test_nan_gradient_is_skipped_and_counted(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=6, training={"use_skip_step_on_nan": True})
    t, _ = run(cfg, tmp_path, hooks=[_nan_at({3})])
    r = rows(tmp_path)
    assert [x["skipped"] for x in r] == [False, False, True, False, False, False]
    assert r[2]["grad_norm"] is None
    assert t.state.total_skipped == 1 and t.state.consecutive_skipped == 0
    assert t.state.applied_steps == 5 and t.state.step == 6
    # the lr does not advance on a skipped step: step 4 applies the lr step 3 would have used
    assert r[3]["lr"] == r[2]["lr"] == pytest.approx(t.lr_scheduler.lr_at(2))
    assert all(np.isfinite(v).all() for v in final_tensors(t).values())


def test_nan_without_skip_stops_and_consecutive_limit(tmp_path):
    cfg = tiny_cfg(tmp_path / "a", steps=4)
    with pytest.raises(FloatingPointError, match=r"global gradient norm is nan at step 2; the "
                                                 r"update was not applied. Set training.use_skip"):
        run(cfg, tmp_path / "a", hooks=[_nan_at({2})])
    cfg = tiny_cfg(tmp_path / "b", steps=6, training={"use_skip_step_on_nan": True,
                                                      "max_consecutive_skipped_steps": 2})
    with pytest.raises(RuntimeError, match=r"\[SkipStepOnNaN\] The global gradient norm has been "
                                           r"NaN/Inf for 2 consecutive steps, which reaches "
                                           r"training.max_consecutive_skipped_steps=2\."):
        run(cfg, tmp_path / "b", hooks=[_nan_at({2, 3})])


def test_sigterm_saves_and_resume_continues_at_next_step(tmp_path):
    def sigterm_at_3(step, grads):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return grads
    cfg = tiny_cfg(tmp_path, steps=1000, checkpoint={"enable_save": False})
    t, reason = run(cfg, tmp_path, hooks=[sigterm_at_3])
    assert reason == "interrupted" and t.state.step == 3
    assert [s for s, _ in list_checkpoints(str(tmp_path / "ckpt"))] == [3]
    resumed = tiny_cfg(tmp_path, steps=5, checkpoint={"load_path": str(tmp_path / "ckpt")})
    out = io.StringIO()
    t2 = Trainer(resumed, str(tmp_path), stream=out)
    t2.train()
    assert "training.steps: 1000 -> 5" in out.getvalue()
    assert "checkpoint.enable_save: False -> True" in out.getvalue()
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4, 5]


def test_run_training_exit_codes(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=2, checkpoint={"enable_save": False})
    assert run_training(cfg, str(tmp_path), stream=io.StringIO()) == 0
    assert os.path.exists(tmp_path / "resolved_config.yaml")
    assert load_config(str(tmp_path / "resolved_config.yaml")) == cfg
    bad = tiny_cfg(tmp_path, steps=2, checkpoint={"load_path": str(tmp_path / "missing")})
    out = io.StringIO()
    assert run_training(bad, str(tmp_path), stream=out) == 1
    assert "no such file or directory" in out.getvalue()


def test_stop_at_step_keeps_the_schedule_of_the_full_run(tmp_path):
    t, _ = run(tiny_cfg(tmp_path, steps=20, training={"stop_at_step": 4}), tmp_path)
    r = rows(tmp_path)
    assert [x["step"] for x in r] == [1, 2, 3, 4]
    assert [x["lr"] for x in r] == [t.lr_scheduler.lr_at(k) for k in range(4)]
    assert r[0]["lr"] == 0.0 and r[3]["lr"] == pytest.approx(5e-3)   # warmup 3 of 20 steps
    assert [s for s, _ in list_checkpoints(str(tmp_path / "ckpt"))] == [4]


def test_rampup_batch_size_changes_accumulation(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=6, training={"global_batch_size": 8,
                                                "rampup_batch_size": [4, 2, 16]})
    run(cfg, tmp_path)
    r = rows(tmp_path)
    # +2 every 16/((8-4)/2) = 8 samples: 4,4 (8 consumed) -> 6 (14) -> 6 (20 > 16) -> 8, 8
    assert [x["global_batch_size"] for x in r] == [4, 4, 6, 6, 8, 8]
    assert [x["consumed_samples"] for x in r] == [4, 8, 14, 20, 28, 36]


def test_grad_norm_skip_threshold_and_num_zeros(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=3, optimizer={"grad_norm_skip_threshold": 1e-9,
                                                 "log_num_zeros_in_grad": True})
    t, _ = run(cfg, tmp_path)
    r = rows(tmp_path)
    assert all(x["skipped"] for x in r) and t.state.applied_steps == 0
    assert [x["lr"] for x in r] == [0.0, 0.0, 0.0]
    cfg = tiny_cfg(tmp_path / "z", steps=2, optimizer={"log_num_zeros_in_grad": True})
    run(cfg, tmp_path / "z")
    assert all(isinstance(x["num_zeros_in_grad"], int) for x in rows(tmp_path / "z"))


def test_checkpoint_contents_and_no_save_optim(tmp_path):
    t, _ = run(tiny_cfg(tmp_path, steps=5), tmp_path)
    data = load_checkpoint(list_checkpoints(str(tmp_path / "ckpt"))[-1][1])
    assert data.state["train_state"]["step"] == 5
    assert data.state["data"]["consumed_samples"] == 20
    assert {"python", "numpy"} <= set(data.state["rng"])
    assert any(k.startswith("optim.adam_v.") for k in data.tensors)
    assert data.config == t.cfg.to_dict()
    cfg = tiny_cfg(tmp_path / "n", steps=2, checkpoint={"no_save_optim": True})
    run(cfg, tmp_path / "n")
    data = load_checkpoint(list_checkpoints(str(tmp_path / "n" / "ckpt"))[-1][1])
    assert not any(k.startswith("optim.") for k in data.tensors)
    from mindformers_core.trainer import CheckpointError
    resume = tiny_cfg(tmp_path / "n", steps=3,
                      checkpoint={"load_path": str(tmp_path / "n" / "ckpt")})
    with pytest.raises(CheckpointError, match="saved with checkpoint.no_save_optim: True; set "
                                              "checkpoint.no_load_optim: True"):
        Trainer(resume, str(tmp_path / "n"), stream=io.StringIO())
    resume = tiny_cfg(tmp_path / "n", steps=3, checkpoint={
        "load_path": str(tmp_path / "n" / "ckpt"), "no_load_optim": True})
    t3 = Trainer(resume, str(tmp_path / "n"), stream=io.StringIO())
    assert t3.state.step == 2 and t3.optimizer.global_step == 0


KILL_SCRIPT = r'''
import os, signal, sys
sys.path.insert(0, {root!r})
sys.path.insert(0, os.path.join({root!r}, "tests", "trainer"))
from test_trainer import tiny_cfg
from mindformers_core.trainer import Trainer
t = Trainer(tiny_cfg({out!r}, steps=1000, checkpoint={{"save_interleaved_steps": 2}}), {out!r})
real_save = t.save
def save_then_die_mid_write():
    if t.state.step < 4:
        return real_save()
    def die_half_way(fh, data):
        fh.write(data[: len(data) // 2]); fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(write_hook=die_half_way)
t.save = save_then_die_mid_write
t.train()
'''


@pytest.mark.slow
def test_sigkill_while_trainer_saves_leaves_previous_checkpoint(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = KILL_SCRIPT.format(root=root, out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert [s for s, _ in list_checkpoints(str(tmp_path / "ckpt"))] == [2]
    assert any(".tmp-" in n for n in os.listdir(tmp_path / "ckpt"))
    resumed = tiny_cfg(tmp_path, steps=3, checkpoint={"load_path": str(tmp_path / "ckpt")})
    t, _ = run(resumed, tmp_path)
    assert t.state.step == 3 and [r["step"] for r in rows(tmp_path)] == [1, 2, 3]
    assert not any(".tmp-" in n for n in os.listdir(tmp_path / "ckpt"))


@pytest.mark.slow
def test_markov_check_loss_falls_half_way_to_the_entropy_floor(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the Markov check as shipped, cut at half its steps (same schedule) to keep the suite short
    cfg = load_config(os.path.join(root, "configs", "markov_check.yaml"))
    half = cfg.training.steps // 2
    cfg = load_config(os.path.join(root, "configs", "markov_check.yaml"),
                      overrides=[f"training.stop_at_step={half}"])
    out = io.StringIO()
    assert run_training(cfg, str(tmp_path), stream=out) == 0
    r = rows(tmp_path)
    assert len(r) == half and all(x["excess_loss"] is not None for x in r)
    first = np.mean([x["excess_loss"] for x in r[:3]])
    last = np.mean([x["excess_loss"] for x in r[-5:]])
    assert last <= 0.5 * first, (first, last)


def test_static_power_of_two_loss_scale_is_exact_in_fp32(tmp_path):
    """Scaling the loss by 2**10 and the grads by 2**-10 is exact in fp32: same run."""
    run(tiny_cfg(tmp_path / "a", steps=3), tmp_path / "a")
    t, _ = run(tiny_cfg(tmp_path / "b", steps=3, optimizer={"loss_scale": 1024.0}), tmp_path / "b")
    ra, rb = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert [r["loss_scale"] for r in rb] == [1024.0] * 3 and "loss_scale" not in ra[0]
    for x, y in zip(ra, rb):
        assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"])


def test_fp16_dynamic_loss_scale_backs_off_on_overflow(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=8, model={"params_dtype": "float16", "compute_dtype": "float16"},
                   optimizer={"initial_loss_scale": 2.0 ** 20, "hysteresis": 1},
                   checkpoint={"enable_save": False})
    t, _ = run(cfg, tmp_path)
    r = rows(tmp_path)
    scales = [x["loss_scale"] for x in r]
    assert r[0]["skipped"] and scales[0] == 2.0 ** 20          # fp16 grads overflow at 2**20
    assert all(b <= a for a, b in zip(scales, scales[1:])) and scales[-1] < 2.0 ** 20
    assert all(b == a / 2 for a, b, x in zip(scales, scales[1:], r) if x["skipped"])
    assert not r[-1]["skipped"] and t.state.applied_steps >= 1
    assert t.state.consecutive_skipped == 0   # overflow skips are not NaN skips
    assert all(np.isfinite(v).all() for v in final_tensors(t).values())


def _moe_muon_cfg(out, steps, **training):
    return load_config({
        "training": {"steps": steps, "local_batch_size": 2, "global_batch_size": 4, "seed": 1,
                     "deterministic": True, **training},
        "optimizer": {"type": "Muon", "qk_clip_threshold": 1.0},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 2.e-2, "warmup_steps": 0},
        "model": {"model_type": "deepseek_v3", "vocab_size": 32, "hidden_size": 32,
                  "num_layers": 2, "num_attention_heads": 2, "seq_length": 8,
                  "moe_aux_loss_coeff": 0.01},
        "checkpoint": {"enable_save": True, "save_path": os.path.join(str(out), "ckpt")},
    })


def test_moe_muon_resume_is_bit_exact_and_updates_expert_bias(tmp_path):
    """DeepSeek-V3 (MLA, MoE, expert bias) + Muon: 4 steps == 2 + resume + 2, bit for bit."""
    a, b = tmp_path / "a", tmp_path / "b"
    ta, _ = run(_moe_muon_cfg(a, 4), a)
    run(_moe_muon_cfg(b, 4, stop_at_step=2), b)
    cfg = _moe_muon_cfg(b, 4)
    cfg.checkpoint.load_path = str(b / "ckpt")
    tc, _ = run(cfg, b)
    assert [r["loss"] for r in rows(a)] == [r["loss"] for r in rows(b)]
    assert all(r["aux_loss"] > 0 for r in rows(a))
    fa, fc = final_tensors(ta), final_tensors(tc)
    assert any(k.startswith("optim.muon_m.") for k in fa)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fc[k], err_msg=k)
    bias = [v for k, v in ta.checkpoint_payload()[0].items() if k.endswith("expert_bias")]
    assert bias and any(np.abs(x).max() > 0 for x in bias)


@pytest.mark.slow
def test_cli_sigterm_exits_0_after_saving_and_resume_continues(tmp_path):
    """The real main job: SIGTERM mid-run -> checkpoint of the finished step, exit code 0;
    the resumed run's first step is the next one."""
    import subprocess
    import sys
    import time
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = [sys.executable, os.path.join(root, "run_mindformer.py"), "--config",
            os.path.join(root, "configs", "markov_check.yaml"), "--mode", "1",
            "--output_dir", str(tmp_path), "--set", "checkpoint.enable_save=False"]
    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=root)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=240)[0].decode()
    assert proc.returncode == 0, output[-3000:]
    assert "received SIGTERM" in output
    saved = list_checkpoints(str(tmp_path / "checkpoint"))
    assert len(saved) == 1
    step = saved[0][0]
    assert [r["step"] for r in rows(tmp_path)] == list(range(1, step + 1))
    resume = base + ["--set", f"checkpoint.load_path={tmp_path / 'checkpoint'}",
                     "--set", f"training.stop_at_step={step + 1}"]
    done = subprocess.run(resume, capture_output=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    assert [r["step"] for r in rows(tmp_path)] == list(range(1, step + 2))
