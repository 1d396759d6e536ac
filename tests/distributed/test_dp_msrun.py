"""2 msrun CPU workers x local batch 2 == 1 process with global batch 4 (accumulation 2).

Two msrun launches, both through scripts/msrun_launcher.sh (6-argument form):

A. (its own launch, the layout matrix's ``prepare`` of group ``dp``) the fault test: the real Trainer on 2 workers (quickstart model, sharded AdamW state,
   checkpoints every 2 steps); rank 1 SIGKILLs itself in step 5. The launcher must end the
   job at once, exit non-zero and name rank 1; the checkpoint of step 4 is complete.
B. (case ``dp`` of the world-2 launch of the layout matrix, layout_cases.py) every case of
   ``dp_case.CASES`` for 10 steps (AdamW and Muon, optimizer state replicated
   ``data_parallel_shard: 1`` and sharded -1, both Muon comm strategies, and AdamW with each
   rank accumulating 2 micro-batches), then the resume of run A from its last checkpoint on 2
   workers to the end (step 6).

This process runs the single-process references (one per optimizer: the comm strategy is
irrelevant on one rank; and one uninterrupted Trainer run) and compares losses, grad norms,
parameters and the full optimizer state (relative 1e-5), the optimizer-state memory per
rank (half of one rank's when sharded), and the Newton-Schulz work split of
``allgather_deredundency``.
"""
import os
import re
import sys
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from dp_case import CASES, STEPS  # noqa: E402
from layout_cases import KILL_AT  # noqa: E402
from msrun_util import read_cases, read_metrics, rel_err  # noqa: E402
from trainer_case import STEPS as TRAINER_STEPS  # noqa: E402

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]
LAYOUT_GROUPS = ("dp",)


@pytest.fixture(scope="module")
def killed_run(layout_matrix):
    run = layout_matrix.prepared("dp")
    return dict(run, out=Path(run["out"]))


@pytest.fixture(scope="module")
def dp_results(layout_matrix):
    out = Path(layout_matrix.case_dir("dp"))
    launch = layout_matrix.launch(2)
    return {"results": read_cases(out, CASES), "stdout": launch["proc"].stdout,
            "log_dir": Path(launch["out"]) / "logs", "resumed": out / "resumed"}


@pytest.fixture(scope="module")
def references():
    import mindspore as ms
    from mindformers_core.distributed.comm import Communicator
    from dp_case import run_case
    ms.runtime.launch_blocking()
    return {"adamw": run_case("adamw_replicated", Communicator(0, 1)),
            "muon": run_case("muon_replicated", Communicator(0, 1))}


def test_launcher_ran_msrun_with_per_worker_logs(dp_results):
    assert "Running Command: msrun --worker_num=2 --local_worker_num=2" in dp_results["stdout"]
    for rank in (0, 1):
        assert (dp_results["log_dir"] / f"worker_{rank}.log").exists()


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_equal_one_rank_with_the_same_global_batch(dp_results, references, case):
    ref = references[CASES[case][0]]
    assert len(ref["losses"]) == STEPS
    for rank in (0, 1):
        got, meta = dp_results["results"][case, rank]
        assert meta["world"] == 2
        assert rel_err(got["losses"], ref["losses"]) < 1e-5
        assert rel_err(got["norms"], ref["norms"]) < 1e-5
        for name, want in ref["params"].items():
            assert rel_err(got[f"param.{name}"], want) < 1e-5, name
        # the (collective) state_dict of a sharded optimizer is the full single-process one
        state_keys = {k[len("state."):] for k in got if k.startswith("state.")}
        assert state_keys == set(ref["state_dict"])
        for key, want in ref["state_dict"].items():
            assert rel_err(got[f"state.{key}"], want) < 1e-5, key
    # the parameters moved (the comparison is not between two untouched models)
    assert ref["param_change"] > 1e-3


def test_ranks_all_reduce_the_host_kernel_sums(dp_results):
    """Each rank of ``adamw_replicated_accumulated`` summed 2 micro-batches; where this
    process has the host add kernel the ranks had it too, so the all-reduce took its sums."""
    from mindformers_core.optim.host.accumulate import host_add_kernel
    for rank in (0, 1):
        meta = dp_results["results"]["adamw_replicated_accumulated", rank][1]
        assert meta["host_add_kernel"] == (host_add_kernel() is not None)


def test_qk_clip_was_exercised(references, dp_results):
    """The Muon cases clip heads (threshold 0.02; the tiny model's max logits are ~0.03), so
    the sharded QK-Clip path and the MAX reduction of the logits are covered."""
    assert references["muon"]["qk_clipped_heads"] > 0
    for case in ("muon_sharded_allgather", "muon_sharded_deredundency"):
        assert dp_results["results"][case, 0][1]["qk_clipped_heads"] == \
            references["muon"]["qk_clipped_heads"]


@pytest.mark.parametrize("case", ["adamw_sharded", "muon_sharded_allgather"])
def test_sharded_state_memory_is_half_of_one_rank(dp_results, references, case):
    single = references[CASES[case][0]]["state_bytes"]
    for rank in (0, 1):
        per_rank = dp_results["results"][case, rank][1]["state_bytes"]
        assert 0.45 <= per_rank / single <= 0.55, (per_rank, single)
    replicated = dp_results["results"][case.replace("sharded_allgather", "replicated")
                                       .replace("sharded", "replicated"), 0][1]["state_bytes"]
    assert replicated == single


def test_deredundency_splits_newton_schulz_work(dp_results):
    ag = [dp_results["results"]["muon_sharded_allgather", r][1] for r in (0, 1)]
    dr = [dp_results["results"]["muon_sharded_deredundency", r][1] for r in (0, 1)]
    # allgather: every rank runs the same NS; deredundency: each rank only its owned matrices
    assert ag[0]["ns_flops"] == ag[1]["ns_flops"] > 0
    for r in (0, 1):
        assert dr[r]["ns_flops"] < 0.7 * ag[r]["ns_flops"]
    owners = dr[0]["ns_owner"]
    assert owners == dr[1]["ns_owner"] and set(owners.values()) == {0, 1}
    # the owners' updates travel back: more bytes than allgather on the CPU fallback
    assert dr[0]["comm"]["bytes"]["all_gather"] > ag[0]["comm"]["bytes"]["all_gather"]


# -- the fault test and the resume (Trainer level) ----------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The same Trainer run in one process (global batch 4 as 2 micro-batches), to the end."""
    import mindspore as ms
    from mindformers_core.trainer import Trainer
    from trainer_case import trainer_config
    out = tmp_path_factory.mktemp("single")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    trainer = Trainer(trainer_config(str(out)), str(out))
    trainer.train()
    return {"metrics": read_metrics(out), "checkpoint": trainer.latest_checkpoint()}


def test_rank_killed_mid_run_fails_fast_and_is_named(killed_run):
    proc = killed_run["proc"]
    assert proc.returncode != 0
    assert re.search(r"msrun_launcher: failing worker: rank 1 \(pid \d+, killed by signal 9\)",
                     proc.stderr), proc.stderr[-3000:]
    assert "stopping the scheduler" in proc.stderr
    # the launcher ended the job right after the kill (msrun alone waits ~30 s more)
    log = open(killed_run["out"] / "logs" / "msrun_launcher.log").read()
    stamps = re.findall(r"(\d+:\d+:\d+)\.(\d+)\.\d+ \[mindspore/parallel/cluster/process_entity/"
                        r"_api\.py:\d+\] (?:Worker|Scheduler) process", log)
    assert len(stamps) >= 2, log[-2000:]
    secs = [sum(int(x) * m for x, m in zip(hms.split(":"), (3600, 60, 1))) + int(ms_) / 1000
            for hms, ms_ in stamps]
    assert secs[-1] - secs[0] < 10
    ckpts = sorted(os.listdir(killed_run["out"] / "checkpoint"))
    assert [c for c in ckpts if c.endswith(".safetensors")][-1].endswith(
        f"{KILL_AT - 1:08d}.safetensors")


def test_dp_trainer_run_matches_one_process_and_resumes(killed_run, dp_results, uninterrupted):
    from mindformers_core.checkpoint.store import load_checkpoint
    ref = {row["step"]: row for row in uninterrupted["metrics"]}
    assert sorted(ref) == list(range(1, TRAINER_STEPS + 1))
    before = [r for r in read_metrics(killed_run["out"]) if r["step"] < KILL_AT]
    after = read_metrics(dp_results["resumed"])
    assert [r["step"] for r in before] == list(range(1, KILL_AT))
    assert [r["step"] for r in after] == list(range(KILL_AT, TRAINER_STEPS + 1))
    for row in before + after:   # the 2-worker loss and grad norm are the global ones
        want = ref[row["step"]]
        assert abs(row["loss"] - want["loss"]) <= 1e-5 * abs(want["loss"])
        assert abs(row["grad_norm"] - want["grad_norm"]) <= 1e-5 * abs(want["grad_norm"])
        assert row["lr"] == pytest.approx(want["lr"], rel=1e-12)
    final = sorted(f for f in os.listdir(dp_results["resumed"] / "checkpoint")
                   if f.endswith(".safetensors"))[-1]
    got = load_checkpoint(str(dp_results["resumed"] / "checkpoint" / final)).tensors
    want = load_checkpoint(uninterrupted["checkpoint"]).tensors
    keys = {k for k in want if k.startswith(("model.", "optim."))}
    assert keys and keys == {k for k in got if k.startswith(("model.", "optim."))}
    for key in keys:   # model, fp32 masters and moments, written once by rank 0, unsharded
        assert rel_err(got[key], want[key]) < 1e-5, key
