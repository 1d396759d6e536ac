"""Start scripts/msrun_launcher.sh with the real CLI in its own session (as a terminal's
foreground job: ``os.killpg`` then does what Ctrl-C does), wait for a training step in a
worker's log, and find processes by their msrun role."""
import os
import re
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "scripts", "msrun_launcher.sh")

# Keeps a 2-worker markov_check run going for minutes: a signal always lands mid-run.
LONG = ("training.steps=400", "checkpoint.save_interleaved_steps=1000")


def cli_command(out, *overrides, config="configs/markov_check.yaml") -> str:
    return (f"python run_mindformer.py --config {config} --mode 1 --output_dir {out} "
            + " ".join(f"--set {o}" for o in overrides))


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLOG_v", "LOG_DIR", "MS_ROLE", "MS_WORKER_NUM", "MASTER_PORT")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start_launcher(args, env=None, prefix=()):
    """``Popen`` of ``bash LAUNCHER *args`` leading a new session and process group
    (``prefix``: e.g. ``ip netns exec NS``). stdout/stderr are pipes."""
    return subprocess.Popen([*prefix, "bash", LAUNCHER, *map(str, args)], cwd=ROOT,
                            env=env if env is not None else clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_step(log, step, proc, timeout=300):
    """Wait until ``log`` (a worker log) shows training step ``step``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the launcher ended ({proc.returncode}) before step {step}:"
                                 f"\n{out[-3000:]}\n{err[-3000:]}")
        if os.path.exists(log) and re.search(rf"step: \[ *{step}/", open(log).read()):
            return
        time.sleep(0.3)
    raise AssertionError(f"no step {step} in {log} after {timeout} s")


def processes(pred):
    """PIDs of the processes whose environment (a set of ``KEY=VALUE`` bytes) satisfies
    ``pred``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = set(open(f"/proc/{pid}/environ", "rb").read().split(b"\0"))
        except OSError:
            continue
        if pred(env):
            found.append(int(pid))
    return found


def tagged_env(tag, **extra) -> dict:
    """``clean_env`` plus ``MFC_TEST_TAG=tag``: every process the launcher starts inherits it,
    so :func:`kill_tagged` finds them in any session."""
    return clean_env(MFC_TEST_TAG=tag, **extra)


def kill_tagged(tag) -> None:
    """SIGKILL every process carrying ``MFC_TEST_TAG=tag`` (a test's finalizer: the launcher,
    msrun, the scheduler and the workers each lead their own session)."""
    mark = f"MFC_TEST_TAG={tag}".encode()
    for pid in processes(lambda env: mark in env):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def finish(proc, timeout=10):
    """``(stdout, stderr)`` of an ended (or killed) launcher."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()
