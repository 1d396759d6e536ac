"""The launcher with the real CLI on 2-3 msrun workers: a killed rank ends the job at once
(named, with its signal, non-zero exit), SIGTERM to the launcher still saves, a config error on
the workers is shown with its rank and exit code 2, worker logs go under --output_dir and the
workers log no MindSpore warnings by default (GLOG_v=3)."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "scripts", "msrun_launcher.sh")

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(out, *overrides, workers=2):
    cmd = (f"python run_mindformer.py --config configs/data_parallel.yaml --mode 1 "
           f"--output_dir {out} " + " ".join(f"--set {o}" for o in overrides))
    env = {k: v for k, v in os.environ.items() if k not in ("GLOG_v", "LOG_DIR", "MS_ROLE")}
    env["MASTER_PORT"] = str(free_port())
    return subprocess.Popen(["bash", LAUNCHER, cmd, str(workers)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(out, step, proc, timeout=240):
    log = os.path.join(str(out), "msrun_log", "worker_0.log")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate())
        if os.path.exists(log) and re.search(rf"step: \[ *{step}/", open(log).read()):
            return
        time.sleep(0.5)
    raise AssertionError(f"no step {step} in {log}")


def worker_pid(rank):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if b"MS_ROLE=MS_WORKER" in env and f"MS_NODE_ID={rank}".encode() in env \
                and b"run_mindformer.py" in cmd:
            return int(pid)
    raise AssertionError(f"no worker of rank {rank}")


LONG = ("training.steps=400", "checkpoint.save_interleaved_steps=1000")


def test_killed_rank_ends_the_job_at_once_naming_rank_and_signal(tmp_path):
    proc = start(tmp_path, *LONG)
    wait_for_step(tmp_path, 2, proc)
    os.kill(worker_pid(1), signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    ended = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "msrun_launcher: the job failed: a worker was killed by signal 9 (SIGKILL)." in err
    assert re.search(r"msrun_launcher: failing worker: rank 1 \(pid \d+, killed by signal 9\)",
                     err), err
    # the scheduler (running the CLI with its graceful-stop handler) no longer holds the job
    # for msrun's ~30 s node timeout
    assert ended < 10, (ended, err)


def test_sigterm_to_the_launcher_saves_and_exits_0_with_quiet_worker_logs(tmp_path):
    proc = start(tmp_path, *LONG)
    wait_for_step(tmp_path, 2, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "received SIGTERM; asking every worker to finish its step" in err
    ckpts = os.listdir(tmp_path / "checkpoint")
    assert any(c.endswith(".safetensors") for c in ckpts), ckpts
    log0 = open(tmp_path / "msrun_log" / "worker_0.log").read()
    assert "training interrupted" in log0
    for name in ("worker_0.log", "worker_1.log"):
        text = open(tmp_path / "msrun_log" / name).read()
        assert "[WARNING]" not in text, text[:2000]
    assert "[WARNING]" not in out


def test_config_error_on_every_worker_is_shown_with_its_rank_and_code_2(tmp_path):
    proc = start(tmp_path, "training.steps=-1", workers=3)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err
    assert re.search(r"msrun_launcher: failing worker: rank \d\b.*\n  error: training.steps: must "
                     r"be > 0, got -1", err), err
    assert "Traceback" not in err


def test_a_stopped_rank_is_named_not_the_healthy_one(tmp_path):
    """SIGSTOP on rank 1: the scheduler notices its missing heartbeats after MS_NODE_TIMEOUT
    (the launcher's default, 8 s); rank 0's collective fails next and msrun would name it."""
    proc = start(tmp_path, *LONG)
    wait_for_step(tmp_path, 2, proc)
    pid = worker_pid(1)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ended = time.monotonic() - t0
    assert proc.returncode != 0, err
    assert re.search(rf"msrun_launcher: failing worker: rank 1 \(pid {pid}, stopped \(SIGSTOP\)\)",
                     err), err
    assert "rank 1 stopped answering the scheduler for 8 s (MS_NODE_TIMEOUT)" in err, err
    assert "failing worker: rank 0" not in err, err
    assert ended < 20, (ended, err)


def test_a_full_disk_names_the_rank_whose_write_failed(tmp_path):
    """Rank 1's rank file hits ENOSPC: both ranks stop with a CheckpointError, the healthy
    rank 0 first ("another rank could not write its part"); the launcher names rank 1."""
    worker = os.path.join(ROOT, "tests", "distributed", "enospc_worker.py")
    env = {k: v for k, v in os.environ.items() if k not in ("GLOG_v", "LOG_DIR", "MS_ROLE")}
    proc = subprocess.run(["bash", LAUNCHER, f"python {worker} {tmp_path}", "2",
                           str(free_port()), str(tmp_path / "msrun_log"), "True", "300"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    err = proc.stderr
    assert proc.returncode == 1, err
    log0 = open(tmp_path / "msrun_log" / "worker_0.log").read()
    assert "ERROR: another rank could not write its part of checkpoint" in log0, log0[-2000:]
    assert re.search(r"msrun_launcher: failing worker: rank 1\b.*\n  ERROR: cannot write checkpoint "
                     r".*rank00001-of-00002.*: No space left on device", err), err
    assert "failing worker: rank 0" not in err, err


def test_a_real_full_tmpfs_names_a_rank_that_ran_out_and_keeps_the_previous_checkpoint(
        tmp_path):
    """The same case on a size-limited tmpfs (a real ENOSPC from the kernel, no seam): the
    launcher names a rank whose own write failed, the failed save leaves no rank file behind
    and the step-2 checkpoint still resolves. Skipped where tmpfs cannot be mounted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        worker = os.path.join(ROOT, "tests", "distributed", "tmpfs_worker.py")
        env = {k: v for k, v in os.environ.items() if k not in ("GLOG_v", "LOG_DIR", "MS_ROLE")}
        proc = subprocess.run(["bash", LAUNCHER, f"python {worker} {tmp_path / 'run'} {disk}",
                               "2", str(free_port()), str(tmp_path / "msrun_log"), "True",
                               "300"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        err = proc.stderr
        assert proc.returncode == 1, err
        named = re.search(r"msrun_launcher: failing worker: rank (\d)\b", err)
        assert named, err
        log = open(tmp_path / "msrun_log" / f"worker_{named.group(1)}.log").read()
        assert "No space left on device" in log, log[-2000:]
        names = os.listdir(disk)
        assert not [n for n in names if "step00000004" in n], names   # nothing of step 4
        from mindformers_core.checkpoint.store import resolve_checkpoint
        assert resolve_checkpoint(str(disk)).state["train_state"]["step"] == 2
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
