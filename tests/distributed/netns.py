"""Two simulated hosts on this machine: two network namespaces joined by a veth pair,
198.18.0.1 and 198.18.0.2 (the benchmarking range, RFC 2544) with loopback up. Traffic
between the nodes stays on that pair; nothing else is routed.

    with two_hosts() as hosts:            # pytest.skip(reason) where namespaces are refused
        subprocess.run([*hosts.prefix(1), "bash", ...])

The namespaces are removed on every way out of the ``with`` (an exception, a failed assert,
KeyboardInterrupt); namespaces left by a process that was SIGKILLed are removed by the next
:func:`two_hosts` (their names carry the creating process's pid).
"""
import contextlib
import os
import re
import shutil
import subprocess

ADDRESSES = ("198.18.0.1", "198.18.0.2")
PREFIX_LEN = 24
_NAME = re.compile(r"^mfct(\d+)n[01]$")


class Hosts:
    """The two namespaces' names; :meth:`prefix` runs a command in one of them."""

    def __init__(self, names):
        self.names = names
        self.addresses = ADDRESSES

    def prefix(self, node):
        return ("ip", "netns", "exec", self.names[node])


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _existing():
    proc = _ip("netns", "list")
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _remove(names):
    for name in names:
        _ip("netns", "del", name)       # also removes its end of the veth pair, and so the pair


def _remove_stale():
    for name in _existing():
        m = _NAME.match(name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _remove([name])


def refusal():
    """Why this machine cannot create the namespaces (None when it can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on PATH"
    probe = f"mfct{os.getpid()}probe"
    proc = _ip("netns", "add", probe)
    if proc.returncode != 0:
        return f"`ip netns add` refused: {proc.stderr.strip() or proc.returncode}"
    _remove([probe])
    return None


@contextlib.contextmanager
def two_hosts():
    import pytest
    why = refusal()
    if why is not None:
        pytest.skip(why)
    _remove_stale()
    tag = f"mfct{os.getpid()}"
    names = (f"{tag}n0", f"{tag}n1")
    veth = (f"mfv{os.getpid()}a", f"mfv{os.getpid()}b")     # at most 15 characters
    steps = [("netns", "add", names[0]), ("netns", "add", names[1]),
             ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
             ("link", "set", veth[0], "netns", names[0]),
             ("link", "set", veth[1], "netns", names[1])]
    for node in (0, 1):
        steps += [("-n", names[node], "addr", "add", f"{ADDRESSES[node]}/{PREFIX_LEN}",
                   "dev", veth[node]),
                  ("-n", names[node], "link", "set", veth[node], "up"),
                  ("-n", names[node], "link", "set", "lo", "up")]
    try:
        for step in steps:
            proc = _ip(*step)
            if proc.returncode != 0:
                pytest.skip(f"`ip {' '.join(step)}` refused: {proc.stderr.strip()}")
        yield Hosts(names)
    finally:
        _remove(names)
        _ip("link", "del", veth[0])     # only if it never moved into a namespace
