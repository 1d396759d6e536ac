"""SIGTERM / SIGINT: finish the current optimizer step, save a checkpoint, exit 0.

A preempted job gets SIGTERM (schedulers, ``kill``) or SIGINT (Ctrl-C). Stopping in the middle
of a step would lose it or leave half-accumulated gradients; so the handler only records the
request and the training loop checks :attr:`StopRequest.requested` between steps. A second
signal of the same kind while already stopping restores the default behaviour, so a user who
presses Ctrl-C twice still gets out at once.

msrun's scheduler process runs the same command but trains nothing; it keeps the default
handlers, so the launcher can end it at once when a worker dies (a graceful-stop handler there
would hold the job until the cluster timeout).

MindSpore's runtime installs a C-level SIGINT handler of its own while it executes ops, and that
handler re-sends the signal as SIGTERM, so a Ctrl-C would be reported as SIGTERM.
:func:`route_sigint_to_a_thread` (called by the CLI before numpy or MindSpore start threads)
avoids that: SIGINT is blocked in the main thread, and so in every thread created later, and a
watcher thread takes it with ``sigwait``. No handler, MindSpore's or ours, runs for it; the
watcher hands it to the active :class:`StopRequest` (or, with none active, raises
KeyboardInterrupt in the main thread, as Python's default does).
"""
from __future__ import annotations

import _thread
import os
import signal
import threading
from typing import List, Optional

__all__ = ["StopRequest", "route_sigint_to_a_thread"]

_ACTIVE: List["StopRequest"] = []     # StopRequests in force, innermost last
_ROUTED = False


def route_sigint_to_a_thread() -> bool:
    """Receive SIGINT in a watcher thread from now on (see the module docstring). Must run in
    the main thread before MindSpore starts its own threads; returns whether it is in force."""
    global _ROUTED
    if _ROUTED:
        return True
    from ..launch_env import is_msrun_scheduler
    if threading.current_thread() is not threading.main_thread() \
            or not hasattr(signal, "pthread_sigmask") or is_msrun_scheduler():
        return False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    threading.Thread(target=_watch_sigint, name="sigint-watcher", daemon=True).start()
    _ROUTED = True
    return True


def _watch_sigint() -> None:
    while True:
        signal.sigwait({signal.SIGINT})
        if _ACTIVE:
            _ACTIVE[-1].deliver(signal.SIGINT)
        else:
            _thread.interrupt_main()   # Python's default: KeyboardInterrupt in the main thread


class StopRequest:
    """Context manager that turns SIGTERM/SIGINT into a flag for the loop."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, log=None):
        self.signum: Optional[int] = None
        self._previous = {}
        self._log = log

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def deliver(self, signum: int) -> None:
        """A signal taken by the SIGINT watcher thread: the first is a stop request, a second
        one ends the process at once (as the default SIGINT action would)."""
        if self.signum is not None:
            os._exit(128 + signum)
        self._record(signum)

    def _record(self, signum: int) -> None:
        self.signum = signum
        if self._log is not None:
            self._log(f"received {signal.Signals(signum).name}: finishing the current step, "
                      "saving a checkpoint and exiting")

    def _handle(self, signum, frame):  # noqa: ARG002 - signal handler signature
        if self.signum is not None:
            # Second signal: give the default behaviour back and re-deliver.
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self._record(signum)

    def __enter__(self) -> "StopRequest":
        from ..launch_env import is_msrun_scheduler
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread() and not is_msrun_scheduler():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous and self in _ACTIVE:
            _ACTIVE.remove(self)
        self._previous.clear()
