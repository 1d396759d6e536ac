"""Two nodes on one machine (tests/distributed/netns.py: two network namespaces joined by a
veth pair, 198.18.0.1 and 198.18.0.2), each running scripts/msrun_launcher.sh in its
9-argument form with the real CLI on configs/markov_check.yaml, sharing the output directory
(the shared filesystem a cluster needs for checkpoints: docs/multi_node.md).

Launches (each shared by the tests that read it; their times are printed with ``-s``):
  dp2     2 nodes x 1 worker, 10 steps, local batch 4, global 8, lr 1e-3
  tp2dp2  2 nodes x 2 workers, tensor_parallel 2 with sequence_parallel, the same batch,
          checkpoints at steps 6 and 10
  resumed the step-6 checkpoint of tp2dp2 on 1 node x 4 workers and on 1 process, to step 10
  single  1 process, the same global batch (the reference)
  lost    2 nodes x 1 worker; every process of node 1 SIGKILLed at step 5
  alone   node 0 of 2 with CLUSTER_TIME_OUT 30; node 1 never starts
  ctrl_c  two launchers on one host at 127.0.0.1 (node 0 and node 1); Ctrl-C on node 0
"""
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from launcher_run import (ROOT, cli_command, finish, kill_tagged, processes, start_launcher,
                          tagged_env, wait_for_step)
from msrun_util import free_port, read_metrics, rel_err
from netns import two_hosts

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

STEPS = 10
BATCH = ("training.local_batch_size=4", "training.global_batch_size=8",
         "lr_scheduler.learning_rate=1e-3")
TP = ("parallelism.tensor_parallel=2", "parallelism.sequence_parallel=true")
RESUME_FROM = 6


def report(name, seconds):
    print(f"\n[launch] {name}: {seconds:.1f} s", file=sys.stderr)


@pytest.fixture(scope="module")
def hosts():
    with two_hosts() as h:
        yield h


def run_nodes(hosts, cmd, local, log_dirs, timeout=600, cluster_time_out=300, nodes=(0, 1)):
    """Start the launcher of every node in ``nodes`` (node 0 first) in its namespace, wait for
    all; ``(results, seconds)`` with ``results[node] = (returncode, stdout, stderr)``."""
    tag = uuid.uuid4().hex
    port = free_port()
    procs = {}
    t0 = time.monotonic()
    try:
        for node in nodes:
            procs[node] = start_launcher(
                [cmd, 2 * local, local, hosts.addresses[0], port, node, log_dirs[node], "True",
                 cluster_time_out], env=tagged_env(tag), prefix=hosts.prefix(node))
        results = {}
        for node, proc in procs.items():
            out, err = proc.communicate(timeout=timeout)
            results[node] = (proc.returncode, out, err)
        return results, time.monotonic() - t0
    finally:
        kill_tagged(tag)
        for proc in procs.values():
            finish(proc)


def require_success(results, log_dirs):
    for node, (rc, out, err) in results.items():
        if rc != 0:
            logs = "".join(open(os.path.join(log_dirs[node], f)).read()[-2000:]
                           for f in sorted(os.listdir(log_dirs[node])) if f.endswith(".log"))
            pytest.fail(f"node {node} exited {rc}:\n{out[-2000:]}\n{err[-3000:]}\n{logs}")


def two_node_run(hosts, tmp_path_factory, name, local, *overrides):
    base = tmp_path_factory.mktemp(name)
    out = str(base / "run")
    logs = {n: str(base / f"log_node{n}") for n in (0, 1)}
    results, seconds = run_nodes(hosts, cli_command(out, f"training.steps={STEPS}", *BATCH,
                                                    *overrides), local, logs)
    report(name, seconds)
    require_success(results, logs)
    return {"out": out, "logs": logs, "results": results, "rows": read_metrics(out)}


def single_process(out, *overrides):
    t0 = time.monotonic()
    cmd = ["python", "run_mindformer.py", "--config", "configs/markov_check.yaml", "--mode", "1",
           "--output_dir", out]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=tagged_env(uuid.uuid4().hex))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return read_metrics(out), time.monotonic() - t0


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    rows, seconds = single_process(str(tmp_path_factory.mktemp("single") / "run"),
                                   f"training.steps={STEPS}", *BATCH)
    report("single", seconds)
    return rows


@pytest.fixture(scope="module")
def dp2(hosts, tmp_path_factory):
    return two_node_run(hosts, tmp_path_factory, "dp2", 1)


@pytest.fixture(scope="module")
def tp2dp2(hosts, tmp_path_factory):
    return two_node_run(hosts, tmp_path_factory, "tp2dp2", 2, *TP,
                        f"checkpoint.save_interleaved_steps={RESUME_FROM}")


def assert_same_steps(got, want, first=1):
    got = [r for r in got if r["step"] >= first]
    want = [r for r in want if r["step"] >= first]
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(first, STEPS + 1))
    for key in ("loss", "grad_norm"):
        assert rel_err([r[key] for r in got], [r[key] for r in want]) < 1e-4, key


def test_dp2_on_two_nodes_equals_one_process(dp2, single):
    assert_same_steps(dp2["rows"], single)


def test_tp2_dp2_on_two_nodes_equals_one_process(tp2dp2, single):
    assert_same_steps(tp2dp2["rows"], single)


def test_each_node_logs_to_its_own_dir_and_names_its_node_and_ranks(dp2, tp2dp2):
    for run, local in ((dp2, 1), (tp2dp2, 2)):
        for node in (0, 1):
            first, last = node * local, node * local + local - 1
            out = run["results"][node][1]
            assert (f"msrun_launcher: node {node} of 2 runs ranks {first}..{last} ({local} of "
                    f"{2 * local} workers); master 198.18.0.1:") in out, out
            logs = sorted(os.listdir(run["logs"][node]))
            assert [f for f in logs if f.startswith("worker_")] == \
                [f"worker_{r}.log" for r in range(first, last + 1)], logs
            # node 0 alone runs the scheduler
            assert ("scheduler.log" in logs) == (node == 0), logs
    ckpts = os.listdir(os.path.join(tp2dp2["out"], "checkpoint"))
    assert sum(".rank" in c and f"step{STEPS:08d}" in c for c in ckpts) == 4, ckpts


def checkpoint_of(run, step):
    path = os.path.join(run["out"], "checkpoint", f"mindformers_core_step{step:08d}.safetensors")
    assert os.path.isfile(path), os.listdir(os.path.dirname(path))
    return path


def test_tp2_dp2_checkpoint_resumes_on_one_node_of_four_workers(tp2dp2, tmp_path):
    from msrun_util import launch
    out = str(tmp_path / "run")
    proc, seconds = launch(cli_command(out, f"training.steps={STEPS}", *BATCH, *TP,
                                       f"checkpoint.load_path={checkpoint_of(tp2dp2, RESUME_FROM)}"),
                           os.path.join(out, "msrun_log"), workers=4)
    report("resumed on 1 node x 4 workers", seconds)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert_same_steps(read_metrics(out), tp2dp2["rows"], first=RESUME_FROM + 1)


def test_tp2_dp2_checkpoint_resumes_on_one_process(tp2dp2, tmp_path):
    rows, seconds = single_process(str(tmp_path / "run"), f"training.steps={STEPS}", *BATCH,
                                   f"checkpoint.load_path={checkpoint_of(tp2dp2, RESUME_FROM)}")
    report("resumed on 1 process", seconds)
    assert_same_steps(rows, tp2dp2["rows"], first=RESUME_FROM + 1)


def test_a_lost_node_ends_node_0_within_15_s_naming_it(hosts, tmp_path):
    from mindformers_core.checkpoint.store import resolve_checkpoint
    out = str(tmp_path / "run")
    logs = {n: str(tmp_path / f"log_node{n}") for n in (0, 1)}
    cmd = cli_command(out, "training.steps=400", "checkpoint.save_interleaved_steps=2", *BATCH)
    tags, port, procs = (uuid.uuid4().hex, uuid.uuid4().hex), free_port(), []
    t_start = time.monotonic()
    try:
        for node in (0, 1):
            procs.append(start_launcher([cmd, 2, 1, hosts.addresses[0], port, node, logs[node],
                                         "True", 300], env=tagged_env(tags[node]),
                                        prefix=hosts.prefix(node)))
        wait_for_step(os.path.join(logs[0], "worker_0.log"), 5, procs[0])
        mark = f"MFC_TEST_TAG={tags[1]}".encode()
        node1 = processes(lambda env: mark in env)
        assert len(node1) >= 3, node1      # the launcher, msrun and the worker at least
        kill_tagged(tags[1])
        t0 = time.monotonic()
        _, err = finish(procs[0], timeout=60)
        ended = time.monotonic() - t0
    finally:
        for tag in tags:
            kill_tagged(tag)
        for proc in procs:
            finish(proc)
    report("lost node", time.monotonic() - t_start)
    assert procs[0].returncode != 0, err
    assert ended < 15, (ended, err)
    assert re.search(r"msrun_launcher: the job failed: node 1 \(NODE_RANK 1, ranks 1\.\.1\) was "
                     r"lost: its rank 1 stopped answering the scheduler at 198\.18\.0\.1:\d+", err), err
    assert "failing worker: rank 0" not in err, err
    # the last complete checkpoint (at least step 4) still loads; nothing of a later one counts
    data = resolve_checkpoint(os.path.join(out, "checkpoint"))
    assert data.step >= 4 and data.step % 2 == 0, data.step


def test_a_node_that_never_joins_ends_node_0_after_the_cluster_timeout(hosts, tmp_path):
    out = str(tmp_path / "run")
    logs = {0: str(tmp_path / "log_node0")}
    results, seconds = run_nodes(hosts, cli_command(out, "training.steps=2"), 1, logs,
                                 cluster_time_out=12, nodes=(0,))
    report("node 1 never joins", seconds)
    rc, _, err = results[0]
    assert rc != 0, err
    assert 12 <= seconds < 100, seconds
    assert re.search(r"the cluster did not form within CLUSTER_TIME_OUT 12 s: 1 of 2 nodes joined "
                     r"the scheduler at 198\.18\.0\.1:\d+; 1 node\(s\) missing: NODE_RANK 1 "
                     r"\(ranks 1\.\.1\)", err), err


def test_ctrl_c_on_node_0_stops_both_nodes_of_one_host_with_a_checkpoint(tmp_path):
    """Two launchers on one host, both at 127.0.0.1 (loopback only): only node 0 starts the
    scheduler, and Ctrl-C on node 0's terminal (SIGINT to its process group) stops every rank
    at a step boundary; both launchers exit 0, as a single-process Ctrl-C does."""
    out = str(tmp_path / "run")
    logs = {n: str(tmp_path / f"log_node{n}") for n in (0, 1)}
    cmd = cli_command(out, "training.steps=400", "checkpoint.save_interleaved_steps=1000", *BATCH)
    tag, port, procs = uuid.uuid4().hex, free_port(), []
    t_start = time.monotonic()
    try:
        for node in (0, 1):
            procs.append(start_launcher([cmd, 2, 1, "127.0.0.1", port, node, logs[node], "True",
                                         300], env=tagged_env(tag)))
        wait_for_step(os.path.join(logs[0], "worker_0.log"), 3, procs[0])
        os.killpg(procs[0].pid, signal.SIGINT)
        t0 = time.monotonic()
        ends = [finish(p, timeout=90) for p in procs]
        took = time.monotonic() - t0
    finally:
        kill_tagged(tag)
        for proc in procs:
            finish(proc)
    report("Ctrl-C on node 0 (one host)", time.monotonic() - t_start)
    assert [p.returncode for p in procs] == [0, 0], ends
    assert took < 90, took
    assert "Start scheduler process" in ends[0][0]
    assert "Start scheduler process" not in ends[1][0], ends[1][0]
    assert "the job failed" not in ends[1][1], ends[1][1]
    ckpts = os.listdir(os.path.join(out, "checkpoint"))
    steps = {re.search(r"step(\d+)", c).group(1) for c in ckpts if ".rank" in c}
    assert len(steps) == 1 and sum(".rank" in c for c in ckpts) == 2, ckpts
    log0 = open(os.path.join(logs[0], "worker_0.log")).read()
    assert "training interrupted" in log0, log0[-2000:]
