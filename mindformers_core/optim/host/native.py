"""Host C kernels: compiled from the package's own C sources at first use, cached, loaded.

On CPU, MindSpore's ``Parameter.asnumpy()`` is a view of the Parameter's storage
(``optim/host/views.py``), so a C function handed those pointers updates the tensors in place
with no MindSpore launch. That is how a multi-tensor optimizer step runs in one call instead
of one ~90 us eager launch per tensor (``optim/host/adam.py`` has the numbers). Device memory
is not aliased, so on Ascend these kernels are never used and MindSpore's own kernels run.

A source is compiled with the system C compiler (``$CC``, else ``cc``) into a shared library
under the cache directory (``$MFC_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/mindformers_core``,
else ``~/.cache/mindformers_core``), named by a hash of the source, the flags and the CPU's
feature flags (``-march=native`` code must not run on another CPU), and written to a temporary
name then renamed, so ranks compiling at once never load a half-written file. No compiler,
a failed compile or ``MFC_NATIVE_KERNELS=0`` means :func:`load` returns None and the caller
keeps its MindSpore path; :func:`unavailable_reason` says why (the trainer logs it once).

The kernels use no OpenMP (its thread pool does not survive ``fork``, which data workers use);
callers split work over Python threads, and ctypes releases the GIL during each call.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["load", "unavailable_reason", "native_kernels_enabled", "cache_dir", "forget",
           "run_split", "FLAGS"]

#: ``-ffp-contract=off``: no fused multiply-adds, so results do not depend on the CPU having
#: FMA and equal the op-by-op rounding of MindSpore's element-wise kernels;
#: ``-fno-math-errno`` lets ``sqrtf`` vectorise (it is exact either way)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-shared", "-fPIC")

_LOCK = threading.Lock()
_LOADED: Dict[str, Optional[ctypes.CDLL]] = {}
_REASONS: Dict[str, str] = {}


def native_kernels_enabled() -> bool:
    """False when ``MFC_NATIVE_KERNELS`` is ``0`` / ``false`` / ``off`` / ``no``."""
    return os.environ.get("MFC_NATIVE_KERNELS", "1").strip().lower() not in (
        "0", "false", "off", "no")


def cache_dir() -> str:
    base = os.environ.get("MFC_NATIVE_CACHE")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "mindformers_core")
    return os.path.join(base, "native")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line.strip()
    except OSError:
        pass
    import platform
    return platform.machine() + platform.processor()


def _compiler() -> Optional[str]:
    cc = os.environ.get("CC", "cc").strip()
    return cc if cc and shutil.which(cc.split()[0]) else None


def _compile(source: str, target: str, cc: str, flags: Sequence[str]) -> Optional[str]:
    """Compile ``source`` into ``target`` atomically; the compiler's error text, or None."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".so.tmp")
    os.close(fd)
    try:
        proc = subprocess.run(cc.split() + list(flags) + [source, "-o", tmp],
                              capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            return (proc.stderr or proc.stdout).strip()[-2000:] or f"exit {proc.returncode}"
        os.replace(tmp, target)
        return None
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load(source: str) -> Optional[ctypes.CDLL]:
    """The shared library built from the C file ``source`` (compiled once per source, flags
    and CPU, then cached), or None when native kernels are off or it cannot be built."""
    source = os.path.abspath(source)
    with _LOCK:
        if source in _LOADED:
            return _LOADED[source]
        lib, reason = None, ""
        cc = _compiler()
        if not native_kernels_enabled():
            reason = "MFC_NATIVE_KERNELS is off"
        elif cc is None:
            reason = f"no C compiler ({os.environ.get('CC', 'cc')!r} not found)"
        elif not os.path.isfile(source):
            reason = f"no C source {source}"
        else:
            with open(source, "rb") as fh:
                text = fh.read()
            for flags in (FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
                key = hashlib.sha256(b"\0".join(
                    [text, cc.encode(), " ".join(flags).encode(), _cpu_flags().encode()])
                ).hexdigest()[:16]
                target = os.path.join(cache_dir(), f"{os.path.basename(source)[:-2]}-{key}.so")
                error = None if os.path.exists(target) else _compile(source, target, cc, flags)
                if error is None:
                    try:
                        lib = ctypes.CDLL(target)
                        break
                    except OSError as exc:
                        error = str(exc)
                reason = f"{cc} could not build {os.path.basename(source)}: {error}"
        _LOADED[source] = lib
        if lib is None:
            _REASONS[source] = reason
        return lib


def unavailable_reason(source: str) -> str:
    """Why :func:`load` returned None for ``source`` ('' when it loaded or was not tried)."""
    return _REASONS.get(os.path.abspath(source), "")


def forget(source: str) -> None:
    """Drop the cached load result of ``source`` (tests switch the environment)."""
    with _LOCK:
        _LOADED.pop(os.path.abspath(source), None)
        _REASONS.pop(os.path.abspath(source), None)


_POOL: List[tuple] = []   # [(pid, threads, executor)]: a forked child has no pool threads


def run_split(run: Callable[[Tuple[int, int]], object], count: int, threads: int) -> list:
    """``[run((lo, hi)) ...]`` over ``threads`` contiguous ranges that cover ``range(count)``,
    in order; the ranges run on a process-wide thread pool (a C call through ctypes releases
    the GIL), a single range on the calling thread."""
    threads = max(1, min(int(threads), count))
    if threads == 1:
        return [run((0, count))]
    with _LOCK:
        if not _POOL or _POOL[0][:2] != (os.getpid(), threads):
            _POOL[:] = [(os.getpid(), threads, ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="mfc-native"))]
        pool = _POOL[0][2]
    cuts = [count * j // threads for j in range(threads + 1)]
    return list(pool.map(run, list(zip(cuts[:-1], cuts[1:]))))
