"""The run directory claim is atomic (trainer/run_dir.py lock_run_dir): two runs started at the
same moment in one empty directory cannot both pass it, and a dead run's lock blocks nobody."""
import io
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import yaml

from mindformers_core.config import ConfigError
from mindformers_core.trainer import Trainer
from mindformers_core.trainer.run_dir import LOCK_FILE, metrics_run_id
from mindformers_core.checkpoint.store import checkpoint_run_id, list_checkpoints
from tests.trainer.tiny_run import tiny_run_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _hold_lock(directory):
    """A process holding ``directory``'s run lock until it is killed."""
    script = textwrap.dedent(f"""
        import sys, time
        from mindformers_core.trainer.run_dir import lock_run_dir
        lock_run_dir({str(directory)!r})
        print("locked", flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.readline().strip() == b"locked"
    return proc


#: run_mindformer.py's main, started once the test says go: both processes have imported
#: everything (MindSpore, the trainer) by then, so they reach the claim within milliseconds
#: of each other instead of whenever their imports happen to finish
_TOGETHER = """
import os, sys, time
import mindspore, run_mindformer, mindformers_core.trainer.trainer
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.005)
sys.exit(run_mindformer.main(sys.argv[2:]))
"""


def test_two_runs_started_together_in_one_directory_one_is_refused(tmp_path):
    out, go = tmp_path / "D", tmp_path / "go"
    args = ["--config", "configs/markov_check.yaml", "--mode", "1", "--output_dir", str(out),
            "--set", "training.steps=2"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    # the seed tells the two apart in resolved_config.yaml
    seeds = (11, 12)
    procs = [subprocess.Popen([sys.executable, "-c", _TOGETHER, str(go)] + args
                              + ["--set", f"training.seed={seed}"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in seeds]
    for p in procs:
        assert p.stdout.readline().strip() == b"ready"
    go.write_text("")
    results = [(p.wait(timeout=300), p.stdout.read().decode(), p.stderr.read().decode(), seed)
               for p, seed in zip(procs, seeds)]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    winner = next(r for r in results if r[0] == 0)
    loser = next(r for r in results if r[0] == 2)
    assert f"error: --output_dir: {out} is in use by another run" in loser[2], loser[2]
    assert "Traceback" not in loser[2]
    # everything in D is the winner's: one run's metrics rows, its checkpoint, its config
    run_id = metrics_run_id(str(out / "metrics.jsonl"))
    assert run_id and run_id != "unknown"
    with open(out / "metrics.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    assert [r["step"] for r in rows] == [1, 2] and {r["run_id"] for r in rows} == {run_id}
    ckpts = list_checkpoints(str(out / "checkpoint"))
    assert ckpts and {checkpoint_run_id(p) for _, p in ckpts} == {run_id}
    with open(out / "resolved_config.yaml") as fh:
        assert yaml.safe_load(fh)["training"]["seed"] == winner[3]


def test_a_running_run_holds_its_directory_and_a_dead_one_does_not(tmp_path):
    out = tmp_path / "D"
    holder = _hold_lock(out)
    try:
        with pytest.raises(ConfigError) as err:
            Trainer(tiny_run_cfg(2), str(out), stream=io.StringIO())
        msg = str(err.value)
        assert msg.startswith(f"--output_dir: {out} is in use by another run (process "
                              f"{holder.pid} holds {out / LOCK_FILE})"), msg
        assert "--output_dir DIR" in msg
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the killed holder left its lock file; the kernel dropped its lock with the process
    assert (out / LOCK_FILE).exists()
    t = Trainer(tiny_run_cfg(2, checkpoint={"enable_save": True}), str(out),
                stream=io.StringIO())
    t.train()
    # resuming the same run directory (same process: the lock is already this process's)
    ck = {"enable_save": True, "load_path": str(out / "checkpoint")}
    again = Trainer(tiny_run_cfg(4, checkpoint=ck), str(out), stream=io.StringIO())
    again.train()
    assert again.run_id == t.run_id and again.state.step == 4


def test_the_lock_is_given_up_when_the_run_ends(tmp_path):
    out = tmp_path / "D"
    t = Trainer(tiny_run_cfg(2, checkpoint={"enable_save": True}), str(out),
                stream=io.StringIO())
    probe = textwrap.dedent(f"""
        from mindformers_core.config import ConfigError
        from mindformers_core.trainer.run_dir import lock_run_dir
        try:
            lock_run_dir({str(out)!r})
            print("free")
        except ConfigError as exc:
            print(exc)
    """)

    def other_process_sees():
        return subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout.strip()
    assert other_process_sees().startswith(f"--output_dir: {out} is in use by another run "
                                           f"(process {os.getpid()} holds")
    t.train()
    assert other_process_sees() == "free"
