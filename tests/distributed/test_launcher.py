"""scripts/msrun_launcher.sh: call forms, argument errors, port in use, the 1-worker direct run.

The 2-worker runs through the launcher (a job that passes, and one whose rank 1 is killed:
the launcher names it and ends the job at once) are in test_dp_msrun.py, which shares their
msrun launches with the data-parallel checks.
"""
import os
import socket
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(ROOT, "scripts", "msrun_launcher.sh")


def run(*args, env=None, timeout=60):
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("ASCEND_RT_VISIBLE_DEVICES", "MASTER_PORT", "MS_ROLE",
                             "MS_WORKER_NUM")}
    full_env.update(env or {})
    return subprocess.run(["bash", LAUNCHER, *args], cwd=ROOT, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def busy_port():
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen(1)
    return s


@pytest.mark.parametrize("args,message", [
    ((), r"missing the command to run \(first argument, quoted\)"),
    (("echo", "2", "3"), r"expected 1, 2, 6 or 9 arguments, got 3"),
    (("   ",), r"the command to run \(first argument\) is empty"),
    (("echo", "x"), r"WORKER_NUM must be a positive integer, got 'x'"),
    (("echo", "0"), r"WORKER_NUM must be a positive integer, got '0'"),
    (("echo", "2", "70000", "/tmp/l", "True", "60"), r"MASTER_PORT must be in 1\.\.65535, got '70000'"),
    (("echo", "2", "8118", "/tmp/l", "maybe", "60"), r"JOIN must be True or False, got 'maybe'"),
    (("echo", "2", "8118", "/tmp/l", "True", "1h"),
     r"CLUSTER_TIME_OUT must be a number of seconds, got '1h'"),
    (("echo", "2", "4", "127.0.0.1", "8118", "0", "/tmp/l", "True", "60"),
     r"LOCAL_WORKER \(4\) must be <= WORKER_NUM \(2\)"),
    (("echo", "2", "0", "127.0.0.1", "8118", "0", "/tmp/l", "True", "60"),
     r"LOCAL_WORKER must be a positive integer, got '0'"),
    (("echo", "2", "1", "127.0.0.1", "8118", "-1", "/tmp/l", "True", "60"),
     r"NODE_RANK must be a non-negative integer, got '-1'"),
    (("echo", "3", "2", "127.0.0.1", "8118", "0", "/tmp/l", "True", "60"),
     r"WORKER_NUM \(3\) must be a multiple of LOCAL_WORKER \(2\): msrun gives every node the "
     r"same number of workers"),
    (("echo", "4", "2", "127.0.0.1", "8118", "2", "/tmp/l", "True", "60"),
     r"NODE_RANK \(2\) must be below the node count WORKER_NUM / LOCAL_WORKER = 2"),
    # TEST-NET-2 (RFC 5737): never an address of this host
    (("echo", "2", "1", "198.51.100.7", "8118", "0", "/tmp/l", "True", "60"),
     r"MASTER_ADDR 198\.51\.100\.7 is not an address of this host; node 0 \(NODE_RANK 0\) runs "
     r"the scheduler there"),
])
def test_argument_errors(args, message):
    import re
    proc = run(*args)
    assert proc.returncode == 2
    assert re.search(r"msrun_launcher: error: " + message, proc.stderr), proc.stderr


def test_a_node_timeout_that_is_no_number_of_seconds_is_refused():
    proc = run("echo", "2", env={"MS_NODE_TIMEOUT": "soon"})
    assert proc.returncode == 2
    assert "msrun_launcher: error: MS_NODE_TIMEOUT must be a positive number of seconds, got " \
        "'soon'" in proc.stderr, proc.stderr


def test_usage_lists_the_call_forms():
    proc = run()
    assert 'usage: bash scripts/msrun_launcher.sh "CMD" [WORKER_NUM]' in proc.stderr
    assert "WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK LOG_DIR JOIN " \
           "CLUSTER_TIME_OUT" in proc.stderr


def test_port_in_use_is_reported_before_anything_starts(tmp_path):
    with busy_port() as s:
        port = s.getsockname()[1]
        proc = run("python -c 'print(1)'", "2", str(port), str(tmp_path / "logs"), "True", "60")
    assert proc.returncode == 2
    assert f"MASTER_PORT {port} is already in use on this host" in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_default_worker_count_is_the_visible_npus(tmp_path):
    """ASCEND_RT_VISIBLE_DEVICES=0,1,2 -> 3 workers (stopped at the busy port: no NPU here)."""
    with busy_port() as s:
        proc = run("python -c 'print(1)'", env={"ASCEND_RT_VISIBLE_DEVICES": "0,1,2",
                                               "MASTER_PORT": str(s.getsockname()[1]),
                                               "LOG_DIR": str(tmp_path / "logs")})
    assert "msrun_launcher: WORKER_NUM=3 (visible NPUs)" in proc.stdout
    assert proc.returncode == 2 and "is already in use" in proc.stderr


def test_one_worker_on_a_cpu_host_runs_the_command_directly():
    code = "import os; print('role', os.environ.get('MS_ROLE'))"
    proc = run(f'python -c "{code}"')
    assert proc.returncode == 0, proc.stderr
    assert "msrun_launcher: WORKER_NUM=1 (no NPU visible: CPU host)" in proc.stdout
    assert "1 worker: running the command directly (no communication init)" in proc.stdout
    assert "role None" in proc.stdout        # not an msrun worker: no scheduler, no init
    proc = run("python -c 'import sys; sys.exit(3)'", "1")
    assert proc.returncode == 3              # the command's status is the launcher's
