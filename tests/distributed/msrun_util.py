"""Launch a command on N msrun CPU workers through scripts/msrun_launcher.sh (6-argument form)."""
import os
import socket
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "scripts", "msrun_launcher.sh")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: str, log_dir, timeout: int = 600, workers: int = 2):
    """``(CompletedProcess, seconds)`` of the launcher running ``cmd`` on ``workers`` workers."""
    t0 = time.monotonic()
    proc = subprocess.run(["bash", LAUNCHER, cmd, str(workers), str(free_port()), str(log_dir),
                           "True", "300"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    return proc, time.monotonic() - t0
