"""Launch a command on N msrun CPU workers through scripts/msrun_launcher.sh (6-argument form);
read what the workers left (their logs, a run's metrics.jsonl)."""
import json
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
    # MindSpore's CPU collectives give up on a peer after a few seconds by default; on a loaded
    # 2-core machine a stage can wait longer than that for its neighbour's first forward
    # ("Ring ReduceScatter wait receiving"), so the tests' workers wait up to 300
    env = dict(os.environ)
    env.setdefault("MS_CPU_COMM_OP_TIMEOUT", "300")
    proc = subprocess.run(["bash", LAUNCHER, cmd, str(workers), str(free_port()), str(log_dir),
                           "True", "300"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)
    return proc, time.monotonic() - t0


def worker_logs(log_dir, workers: int = 2) -> str:
    """The tail of every worker's log (for a failure message)."""
    return "".join(open(os.path.join(log_dir, f)).read()[-3000:]
                   for f in (f"worker_{r}.log" for r in range(workers))
                   if os.path.exists(os.path.join(log_dir, f)))


def read_metrics(run_dir):
    """The rows of a run's metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def rel_err(got, want) -> float:
    """max |got - want| / max |want| (the relative error the parallel tests compare with)."""
    import numpy as np
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-12))


def read_cases(out_dir, names, workers: int = 2):
    """``{(case, rank): (arrays, meta)}``: each rank's ``{case}.rank{r}.npz`` / ``.json`` in
    ``out_dir`` (what tests/distributed/dp_worker.py and cp_worker.py write)."""
    import numpy as np
    results = {}
    for name in names:
        for rank in range(workers):
            base = os.path.join(out_dir, f"{name}.rank{rank}")
            z = np.load(base + ".npz")
            with open(base + ".json") as fh:
                results[name, rank] = ({k: z[k] for k in z.files}, json.load(fh))
    return results
