"""The msrun layout-matrix harness: every parallel case of the test suite as data, run as ONE
msrun launch per world size (2 and 4 workers; 8 later), each case in turn inside the same
worker processes (one communication init), against one process.

A case is either

* a :class:`TrainerCase`: a config file, the overrides both sides share, the overrides of the
  N-worker side only (the layout), the metrics.jsonl keys compared per step and their
  tolerance. The worker trains it with the real Trainer into ``<out>/<name>/``; the
  1-process reference (the same config without the layout overrides) runs in the pytest
  process, once per distinct config, and ``test_layout_cases_msrun.py`` compares them;
* a :class:`JobCase`: a worker function ``module:function`` called as
  ``function(case_dir, *args)`` on every rank (the per-kind checks that look inside a rank:
  shards, optimizer state, communicator counters). Its test module reads ``case_dir``.

Cases live in ``layout_cases.py``, each under a ``group`` (the test module that reads it). A
test module names its groups in ``LAYOUT_GROUPS``; a pytest session launches, per world, only
the cases of the groups its collected modules name. A group may have a ``prepare`` function,
run in the pytest process before its world's launch (a 1-process checkpoint the workers
resume, the killed run of the fault test); its dict fills ``{key}`` fields of the cases' args
and is given to the tests (``LayoutMatrix.prepared``).

Failures stay per case: a case that raised on a rank leaves its traceback (``.error.rankR``),
later cases did not run, and each test names its case, world and the launch's worker log tails.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "layout_worker.py")


@dataclass(frozen=True)
class TrainerCase:
    """N workers under ``layout`` == 1 process, the Trainer on both sides.

    ``config``: a yaml path relative to the repository root. ``overrides``: dotted
    ``key=value`` overrides of both sides (steps, batch, model size). ``layout``: the N-worker
    side's overrides (``parallelism.*``). ``reference``: overrides of the 1-process side only
    (a local batch that keeps the global batch). ``metrics``: the metrics.jsonl keys compared
    at every step (a key a row lacks on both sides is skipped for that row; ``lr`` is compared
    at 1e-12). ``checks``: names of extra checks in ``test_layout_cases_msrun.CHECKS``.
    ``resume_at``: the workers then resume their own step-``resume_at`` checkpoint under the
    same layout into ``<case dir>/resumed`` (its steps are compared too; the overrides must
    save at that step). ``one_process_at``: one process resumes the layout's step-N checkpoint
    (merged by ``tools/convert_checkpoint.py`` when it is sharded) and runs the reference's
    next steps (``test_layout_cases_msrun.py``). ``resume_from``: ``(case, step)``: the workers
    start from that other case's step checkpoint (another layout, often another world: its
    launch runs first), so the rows begin at step + 1 and are compared with the reference's
    and with that case's uninterrupted ones."""
    name: str
    world: int
    config: str
    overrides: Tuple[str, ...] = ()
    layout: Tuple[str, ...] = ()
    reference: Tuple[str, ...] = ()
    metrics: Tuple[str, ...] = ("loss", "grad_norm")
    rtol: float = 1e-4
    steps: Optional[int] = None
    checks: Tuple[str, ...] = ()
    group: str = "layouts"
    resume_at: Optional[int] = None
    one_process_at: Optional[int] = None
    resume_from: Optional[Tuple[str, int]] = None

    def worker_overrides(self, run_dir: str, load_path: Optional[str] = None):
        return list(self.overrides) + list(self.layout) + [
            f"checkpoint.save_path={os.path.join(run_dir, 'checkpoint')}"] + (
            [f"checkpoint.load_path={load_path}"] if load_path else [])

    def reference_overrides(self, run_dir: str):
        return list(self.overrides) + list(self.reference) + [
            f"checkpoint.save_path={os.path.join(run_dir, 'checkpoint')}"]

    def reference_key(self):
        """Cases with the same key share one 1-process run."""
        return (self.config, tuple(self.overrides), tuple(self.reference))


@dataclass(frozen=True)
class JobCase:
    """``target`` (``module:function`` of tests/distributed or tests/models) called on every
    rank as ``function(case_dir, *args)``; ``{key}`` in an arg is filled from the group's
    ``prepare`` dict."""
    name: str
    world: int
    target: str
    args: Tuple = ()
    group: str = ""


@dataclass
class Group:
    """The cases a test module reads and what must exist before they run."""
    name: str
    prepare: Optional[Callable[[str], dict]] = None
    cases: list = field(default_factory=list)


def train_one(config: str, overrides, run_dir: str):
    """The real Trainer on ``config`` + ``overrides`` into ``run_dir`` (both sides)."""
    import mindspore as ms
    from mindformers_core.config import load_config
    from mindformers_core.trainer import Trainer
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(load_config(os.path.join(ROOT, config), overrides=list(overrides)),
                      run_dir, overwrite=True)
    trainer.train()
    return trainer


def train_case(case_dir: str, config: str, overrides, resume_at: Optional[int] = None) -> None:
    """The worker side of a TrainerCase (its run directory is the case's), then the resume of
    its step-``resume_at`` checkpoint into ``resumed/`` (TrainerCase.resume_at)."""
    train_one(config, overrides, case_dir)
    if resume_at is not None:
        ckpt = checkpoint_path(case_dir, resume_at)
        resumed = os.path.join(case_dir, "resumed")
        train_one(config, list(overrides) + [
            f"checkpoint.save_path={os.path.join(resumed, 'checkpoint')}",
            f"checkpoint.load_path={ckpt}"], resumed)


def checkpoint_path(case_dir: str, step: int) -> str:
    """The step-``step`` checkpoint a TrainerCase's run wrote under ``case_dir``."""
    return os.path.join(case_dir, "checkpoint", f"mindformers_core_step{step:08d}.safetensors")


def plan_entry(case, case_dir: str, prepared: dict, load_path: Optional[str] = None) -> dict:
    """What the worker runs for ``case``: a target and its arguments (JSON); ``load_path``:
    the checkpoint of ``case.resume_from``."""
    if isinstance(case, TrainerCase):
        return {"name": case.name, "dir": case_dir, "target": "layout_matrix:train_case",
                "args": [case.config, case.worker_overrides(case_dir, load_path)]
                + ([case.resume_at] if case.resume_at is not None else [])}
    args = [a.format(**prepared) if isinstance(a, str) else a for a in case.args]
    return {"name": case.name, "dir": case_dir, "target": case.target, "args": args}


class LaunchFailed(Exception):
    pass


class LayoutMatrix:
    """Session state: one launch per world, run on first use (``case_dir``)."""

    def __init__(self, groups: Dict[str, Group], needed, base_dir: str):
        self.groups = {k: g for k, g in groups.items() if k in needed}
        self.base = base_dir
        self._prepared: Dict[str, dict] = {}
        self._launched: Dict[int, dict] = {}

    def cases(self, world: Optional[int] = None):
        return [c for g in self.groups.values() for c in g.cases
                if world is None or c.world == world]

    def case(self, name: str):
        for c in self.cases():
            if c.name == name:
                return c
        raise KeyError(f"no layout case {name!r} among the collected groups "
                       f"{sorted(self.groups)}")

    def prepared(self, group: str) -> dict:
        if group not in self._prepared:
            g = self.groups[group]
            self._prepared[group] = {}
            if g.prepare is not None:
                out = os.path.join(self.base, f"prepare_{group}")
                os.makedirs(out, exist_ok=True)
                self._prepared[group] = g.prepare(out)
        return self._prepared[group]

    def launch(self, world: int) -> dict:
        """Run every collected case of ``world`` in one msrun launch (once per session)."""
        if world in self._launched:
            return self._launched[world]
        from msrun_util import launch
        out = os.path.join(self.base, f"world{world}")
        os.makedirs(out, exist_ok=True)
        cases = self.cases(world)
        plan = [plan_entry(c, os.path.join(out, c.name), self.prepared(self._group_of(c)),
                           self._resume_path(c)) for c in cases]
        plan_path = os.path.join(out, "plan.json")
        with open(plan_path, "w") as fh:
            json.dump(plan, fh, indent=1)
        t0 = time.monotonic()
        proc, _ = launch(f"python {WORKER} {plan_path}", os.path.join(out, "logs"),
                         timeout=3600, workers=world)
        self._launched[world] = {"proc": proc, "out": out, "plan": plan,
                                 "seconds": time.monotonic() - t0}
        with open(os.path.join(out, "launch.json"), "w") as fh:
            json.dump({"rc": proc.returncode, "seconds": self._launched[world]["seconds"],
                       "cases": [p["name"] for p in plan]}, fh)
        return self._launched[world]

    def _resume_path(self, case) -> Optional[str]:
        """The checkpoint ``case.resume_from`` names; its world's launch runs first (a
        failed source case fails this one when it finds no checkpoint)."""
        if not isinstance(case, TrainerCase) or case.resume_from is None:
            return None
        source, step = case.resume_from
        src = self.case(source)
        if src.world != case.world:
            self.launch(src.world)
        elif self.cases(case.world).index(src) > self.cases(case.world).index(case):
            raise ValueError(f"layout case {case.name} resumes {source}, which runs after it "
                             f"in the same launch: list {source} first")
        return checkpoint_path(os.path.join(self.base, f"world{src.world}", source), step)

    def _group_of(self, case) -> str:
        return next(k for k, g in self.groups.items() if case in g.cases)

    def logs(self, world: int) -> str:
        from msrun_util import worker_logs
        run = self._launched[world]
        return (f"launcher exit {run['proc'].returncode}; stderr tail:\n"
                f"{run['proc'].stderr[-2000:]}\n"
                + worker_logs(os.path.join(run["out"], "logs"), world))

    def case_dir(self, name: str) -> str:
        """The directory case ``name`` wrote on every rank; fails the calling test with the
        case's traceback, or the case that stopped the launch, and the workers' log tails."""
        import pytest
        case = self.case(name)
        run = self.launch(case.world)
        case_dir = os.path.join(run["out"], name)
        for rank in range(case.world):
            err = os.path.join(case_dir, f".error.rank{rank}")
            if os.path.exists(err):
                pytest.fail(f"layout case {name} (world {case.world}) raised on rank {rank}:\n"
                            f"{open(err).read()[-4000:]}\n{self.logs(case.world)}")
        missing = [r for r in range(case.world)
                   if not os.path.exists(os.path.join(case_dir, f".done.rank{r}"))]
        if missing:
            names = [p["name"] for p in run["plan"]]
            stopped = next((n for n in names if not all(os.path.exists(os.path.join(
                run["out"], n, f".done.rank{r}")) for r in range(case.world))), None)
            pytest.fail(f"layout case {name} (world {case.world}) did not finish on ranks "
                        f"{missing}: the launch stopped at case {stopped} (cases in order: "
                        f"{names})\n{self.logs(case.world)}")
        return case_dir

    def reference_dir(self, case: TrainerCase) -> str:
        """The 1-process run of ``case`` (shared by the cases with the same config)."""
        key = json.dumps(case.reference_key())
        refs = self._prepared.setdefault("__references__", {})
        if key not in refs:
            run_dir = os.path.join(self.base, "references", f"ref{len(refs)}_{case.name}")
            train_one(case.config, case.reference_overrides(run_dir), run_dir)
            refs[key] = run_dir
        return refs[key]


def needed_groups(items) -> set:
    """The groups the collected test modules name in ``LAYOUT_GROUPS``."""
    out = set()
    for item in items:
        out.update(getattr(getattr(item, "module", None), "LAYOUT_GROUPS", ()))
    return out


def compare_rows(name: str, got, want, metrics, rtol: float, steps=None):
    """Per-step comparison of two metrics.jsonl row lists; the message names the case, the
    step, the key, got and want."""
    import math
    got_steps = [r["step"] for r in got if "loss" in r]
    want_steps = [r["step"] for r in want if "loss" in r]
    assert got_steps == want_steps, f"{name}: steps {got_steps} != reference {want_steps}"
    if steps is not None:
        assert got_steps == list(range(1, steps + 1)), f"{name}: steps {got_steps}"
    ref = {}
    for r in want:
        ref.setdefault(r["step"], {}).update(r)
    rows = {}
    for r in got:
        rows.setdefault(r["step"], {}).update(r)
    for step, row in sorted(rows.items()):
        w = ref[step]
        for key in metrics:
            if key not in row and key not in w:
                continue
            assert key in row and key in w, f"{name} step {step}: {key} only on one side"
            g, v = row[key], w[key]
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                ok = math.isclose(g, v, rel_tol=rtol, abs_tol=0.0) if v else g == v
                assert ok, (f"{name} step {step}: {key} got {g!r}, want {v!r} "
                            f"(rel {abs(g - v) / max(abs(v), 1e-30):.2e} > {rtol})")
            else:
                assert g == v, f"{name} step {step}: {key} got {g!r}, want {v!r}"
        if "lr" in row and "lr" in w:
            assert math.isclose(row["lr"], w["lr"], rel_tol=1e-12), \
                f"{name} step {step}: lr got {row['lr']}, want {w['lr']}"
