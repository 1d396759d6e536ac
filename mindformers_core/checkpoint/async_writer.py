"""``checkpoint.async_save``: checkpoint files written by a background thread.

The step's tensors are copied (``snapshot``) on the training thread, so later optimizer steps
cannot change what is being written; the file itself is written by the same atomic
``save_checkpoint`` (temp file, fsync, rename), so a process killed at any moment leaves the
previous complete checkpoints and at most a ``.tmp`` file, never a torn checkpoint. One save
is in flight at a time: the next ``submit`` and the end of the run ``wait`` for it, and an
error of the background write is raised there.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional

import numpy as np

__all__ = ["AsyncCheckpointWriter", "snapshot"]


def snapshot(tensors: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Owned copies of the tensors (the originals may be live optimizer buffers)."""
    return {k: np.array(v, copy=True) for k, v in tensors.items()}


class AsyncCheckpointWriter:
    def __init__(self):
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.last_path: Optional[str] = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], str]) -> None:
        """Run ``write()`` (returns the written path) in the background, after the previous
        one finished."""
        self.wait()

        def run():
            try:
                self.last_path = write()
            except BaseException as exc:  # re-raised on the training thread by wait()
                self._error = exc

        # not a daemon: the interpreter finishes the write before exiting
        self._thread = threading.Thread(target=run, name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> Optional[str]:
        """Block until no save is in flight; returns the last written path."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return self.last_path
