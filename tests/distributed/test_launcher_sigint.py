"""Ctrl-C on a 2-worker run through scripts/msrun_launcher.sh: every rank finishes its step,
the run saves a checkpoint and the launcher exits 0, as a single-process run interrupted by
SIGINT does (trainer/run.py: "stopped by SIGTERM/SIGINT after saving" is exit 0).

Both ways the signal arrives are tested: a terminal's Ctrl-C goes to the whole foreground
process group (``os.killpg`` on the launcher's group), ``kill -INT PID`` to the launcher only.
Before the fix the group signal also reached msrun, which SIGKILLs its workers on SIGINT and
exits 0: no checkpoint, and "success"."""
import os
import signal
import time
import uuid

import pytest

from launcher_run import (LONG, cli_command, finish, kill_tagged, start_launcher, tagged_env,
                          wait_for_step)
from msrun_util import free_port

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def checkpoints(out):
    d = os.path.join(out, "checkpoint")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


@pytest.mark.parametrize("delivery", ["process_group", "launcher_pid"])
def test_ctrl_c_saves_on_every_rank_and_exits_0(tmp_path, delivery):
    out = str(tmp_path / "run")
    tag = uuid.uuid4().hex
    log_dir = os.path.join(out, "msrun_log")
    proc = start_launcher([cli_command(out, *LONG), 2, free_port(), log_dir, "True", 300],
                          env=tagged_env(tag))
    try:
        wait_for_step(os.path.join(log_dir, "worker_0.log"), 2, proc)
        t0 = time.monotonic()
        if delivery == "process_group":
            os.killpg(proc.pid, signal.SIGINT)      # what a terminal does on Ctrl-C
        else:
            os.kill(proc.pid, signal.SIGINT)
        _, err = finish(proc, timeout=90)
        took = time.monotonic() - t0
    finally:
        kill_tagged(tag)
        finish(proc)
    assert proc.returncode == 0, err
    assert took < 90, took
    assert "received SIGINT; asking every worker to finish its step, save and exit" in err
    assert any(c.endswith(".safetensors") or c.startswith("step") for c in checkpoints(out)), \
        (checkpoints(out), err)
    for rank in (0, 1):
        log = open(os.path.join(log_dir, f"worker_{rank}.log")).read()
        assert "received SIGTERM: finishing the current step" in log, log[-2000:]
    assert "training interrupted" in open(os.path.join(log_dir, "worker_0.log")).read()
