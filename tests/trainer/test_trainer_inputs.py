"""The run plan and the LR schedule are computed once per run by the caller (run_training) and
handed to the Trainer, which uses those objects as they are and computes them only when absent."""
import io

from mindformers_core.trainer import Trainer

from tests.trainer.test_trainer import tiny_cfg


def test_trainer_uses_the_plan_and_schedule_it_is_given(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=2, checkpoint={"enable_save": False})
    plan, sched = cfg.plan(1), cfg.build_lr_scheduler()
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO(), plan=plan, lr_scheduler=sched)
    assert t.plan is plan and t.lr_scheduler is sched


def test_trainer_computes_the_plan_when_none_is_given(tmp_path):
    cfg = tiny_cfg(tmp_path, steps=2, checkpoint={"enable_save": False})
    t = Trainer(cfg, str(tmp_path), stream=io.StringIO())
    assert t.plan == cfg.plan(1)
    assert t.plan.num_accumulation_steps == 2   # global 4 = 2 micro-batches of 2 on 1 rank
