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
handler re-sends the signal as SIGTERM; a Ctrl-C that lands inside an op is therefore reported
as SIGTERM. The stop behaves the same either way.
"""
from __future__ import annotations

import signal
import threading
from typing import Optional

__all__ = ["StopRequest"]


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

    def _handle(self, signum, frame):  # noqa: ARG002 - signal handler signature
        if self.signum is not None:
            # Second signal: give the default behaviour back and re-deliver.
            signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.signum = signum
        if self._log is not None:
            self._log(f"received {signal.Signals(signum).name}: finishing the current step, "
                      "saving a checkpoint and exiting")

    def __enter__(self) -> "StopRequest":
        from ..distributed.env import is_msrun_scheduler
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread() and not is_msrun_scheduler():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
