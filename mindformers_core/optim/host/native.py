"""Host C kernels: compiled from the package's own C sources at first use, cached, loaded.

On CPU, MindSpore's ``Parameter.asnumpy()`` is a view of the Parameter's storage
(``optim/host/views.py``), so a C function handed those pointers updates the tensors in place
with no MindSpore launch. That is how a multi-tensor optimizer step runs in one call instead
of one ~90 us eager launch per tensor (``optim/host/adam.py`` has the numbers). Device memory
is not aliased, so on Ascend these kernels are never used and MindSpore's own kernels run.

A source is compiled with the system C compiler (``$CC``, else ``cc``) into a shared library
under the cache directory (``$MFC_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/mindformers_core``,
else ``~/.cache/mindformers_core``), named by a hash of the source, the flags and the CPU's
feature flags (``-march=native`` code must not run on another CPU). A build is loaded from its
temporary name, then renamed into the cache, so ranks compiling at once never load a
half-written file; the sha256 of its bytes goes beside it (``<name>.so.sha256``, also written
to a temporary name and renamed).

Nothing from the cache is loaded unverified: a cached library whose bytes do not match its
recorded digest (a flipped bit, a truncated file: loading that one dies of SIGBUS), that has
no digest, or that lacks the symbols its caller needs is rebuilt. A cache directory that
cannot be written is replaced by a private temporary one for this process
(:func:`cache_notes` says so). All compiles of a process together get
:data:`COMPILE_BUDGET_S` seconds (``$MFC_NATIVE_COMPILE_BUDGET`` overrides it); a compiler
still running then is killed and every later build declined. A SIGTERM or SIGINT arriving
during a compile kills the compiler and then reaches the handler that was in place (the
trainer's stop request, or the default action); a compiler killed by a signal (Ctrl-C reaches
the whole process group) also ends compiling for the process. No compiler, a failed compile,
the budget spent or ``MFC_NATIVE_KERNELS=0`` means :func:`load` returns None and the caller
keeps its MindSpore path; :func:`unavailable_reason` says why.

The kernels use no OpenMP (its thread pool does not survive ``fork``, which data workers use);
callers split work over Python threads, and ctypes releases the GIL during each call.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["load", "unavailable_reason", "native_kernels_enabled", "cache_dir", "cache_notes",
           "forget", "run_split", "compile_budget_s", "digest_path", "FLAGS",
           "COMPILE_BUDGET_S"]

#: ``-ffp-contract=off``: no fused multiply-adds, so results do not depend on the CPU having
#: FMA and equal the op-by-op rounding of MindSpore's element-wise kernels;
#: ``-fno-math-errno`` lets ``sqrtf`` vectorise (it is exact either way)
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-shared", "-fPIC")
#: seconds all compiles of one process may take together before the MindSpore path is used
#: (a build takes ~1 s; a hung compiler must not hold a run before step 1)
COMPILE_BUDGET_S = 60.0
#: how often a running compile looks for its deadline and for a stop signal
_POLL_S = 0.1

_LOCK = threading.Lock()
_LOADED: Dict[str, Optional[ctypes.CDLL]] = {}
_REASONS: Dict[str, str] = {}
#: process-wide compile state: seconds spent, why compiling stopped for good, the private
#: directory used when the cache cannot be written, and what was noted about the cache
_STATE: Dict[str, object] = {"spent": 0.0, "stopped": "", "private": "", "notes": []}


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


def compile_budget_s() -> float:
    """:data:`COMPILE_BUDGET_S`, or ``$MFC_NATIVE_COMPILE_BUDGET`` seconds when set."""
    value = os.environ.get("MFC_NATIVE_COMPILE_BUDGET", "").strip()
    try:
        return float(value) if value else COMPILE_BUDGET_S
    except ValueError:
        return COMPILE_BUDGET_S


def _budget_spent() -> str:
    return f"compiling ran past its {compile_budget_s():g} s budget"


def cache_notes() -> List[str]:
    """What this process noted about the cache (e.g. a directory it could not write)."""
    return list(_STATE["notes"])


def digest_path(library: str) -> str:
    """The file beside a cached library that records its sha256."""
    return library + ".sha256"


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


def _sha256(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


def _recorded_digest(library: str) -> Optional[str]:
    try:
        with open(digest_path(library), encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _note(text: str) -> None:
    if text not in _STATE["notes"]:
        _STATE["notes"].append(text)


def _build_dir() -> str:
    """The cache directory when it can be written, else this process's private one."""
    directory = cache_dir()
    if _STATE["private"]:
        return str(_STATE["private"])
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=directory, suffix=".probe")
        os.close(fd)
        os.remove(probe)
        return directory
    except OSError as exc:
        private = tempfile.mkdtemp(prefix="mfc-native-")
        atexit.register(shutil.rmtree, private, True)
        _STATE["private"] = private
        _note(f"cache {directory} not writable ({exc.strerror or exc}); built in {private}")
        return private


class _Interrupted:
    """SIGTERM/SIGINT during a compile: recorded here, handed to the previous handler after
    the compiler is killed (main thread only; elsewhere signals stay where they are)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.caught: List[int] = []
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "_Interrupted":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                try:
                    self._previous[sig] = signal.signal(sig, self._record)
                except (ValueError, OSError):
                    pass
        return self

    def _record(self, signum, frame):  # noqa: ARG002 - signal handler signature
        self.caught.append(signum)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        for sig in self.caught:
            handler = self._previous.get(sig, signal.SIG_DFL)
            if callable(handler):
                handler(sig, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(sig)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _run_compiler(cmd: List[str], budget: float) -> Tuple[Optional[int], str]:
    """(exit code, output) of the compiler; (None, why) when it was killed: the budget ran
    out (which stops all later compiles) or a signal came."""
    t0 = time.monotonic()
    try:
        with _Interrupted() as stop:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            try:
                while True:
                    left = budget - (time.monotonic() - t0)
                    why = (_budget_spent() if left <= 0 else
                           f"compile interrupted by {_signal_name(stop.caught[0])}"
                           if stop.caught else "")
                    if why:
                        proc.kill()
                        proc.communicate()
                        _STATE["stopped"] = why
                        return None, why
                    try:
                        out, _ = proc.communicate(timeout=min(_POLL_S, left))
                    except subprocess.TimeoutExpired:
                        continue
                    if proc.returncode < 0:   # Ctrl-C reaches the compiler in our group too
                        why = f"the compiler was killed by {_signal_name(-proc.returncode)}"
                        _STATE["stopped"] = why
                        return None, why
                    return proc.returncode, out or ""
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    finally:
        _STATE["spent"] = float(_STATE["spent"]) + time.monotonic() - t0


def _compile(source: str, target: str, cc: str, flags: Sequence[str]
             ) -> Tuple[Optional[ctypes.CDLL], str]:
    """Build ``source``, load the build, then move it (and its digest) to ``target``:
    (library, '') or (None, why)."""
    if _STATE["stopped"]:
        return None, str(_STATE["stopped"])
    budget = compile_budget_s() - float(_STATE["spent"])
    if budget <= 0:
        _STATE["stopped"] = _budget_spent()
        return None, str(_STATE["stopped"])
    directory = os.path.dirname(target)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".so.tmp")
        os.close(fd)
    except OSError as exc:
        return None, str(exc)
    tmp_digest = ""
    try:
        code, out = _run_compiler(cc.split() + list(flags) + [source, "-o", tmp], budget)
        if code is None:
            return None, out
        if code != 0:
            return None, out.strip()[-2000:] or f"exit {code}"
        digest = _sha256(tmp)
        lib = ctypes.CDLL(tmp)   # these bytes, before anyone else can replace them
        fd, tmp_digest = tempfile.mkstemp(dir=directory, suffix=".sha256.tmp")
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(f"{digest}\n")
        os.replace(tmp, target)
        os.replace(tmp_digest, digest_path(target))
        return lib, ""
    except OSError as exc:
        return None, str(exc)
    finally:
        for leftover in (tmp, tmp_digest):
            if leftover and os.path.exists(leftover):
                os.remove(leftover)


def _missing(lib: ctypes.CDLL, symbols: Sequence[str]) -> List[str]:
    return [name for name in symbols if not hasattr(lib, name)]


def _load_cached(target: str, symbols: Sequence[str]) -> Optional[ctypes.CDLL]:
    """The cached library at ``target`` when its bytes match its recorded digest and it
    has ``symbols``; None (rebuild) otherwise."""
    recorded = _recorded_digest(target)
    if recorded is None or _sha256(target) != recorded:
        return None
    try:
        lib = ctypes.CDLL(target)
    except OSError:
        return None
    return lib if not _missing(lib, symbols) else None


def _key(text: bytes, cc: str, flags: Sequence[str]) -> str:
    return hashlib.sha256(b"\0".join(
        [text, cc.encode(), " ".join(flags).encode(), _cpu_flags().encode()])).hexdigest()[:16]


def _build_or_load(source: str, cc: str, symbols: Sequence[str]
                   ) -> Tuple[Optional[ctypes.CDLL], str]:
    with open(source, "rb") as fh:
        text = fh.read()
    name = os.path.basename(source)[:-2]
    reason = ""
    for flags in (FLAGS, tuple(f for f in FLAGS if f != "-march=native")):
        file_name = f"{name}-{_key(text, cc, flags)}.so"
        cached = os.path.join(cache_dir(), file_name)
        lib = _load_cached(cached, symbols)
        if lib is None and _STATE["private"]:
            lib = _load_cached(os.path.join(str(_STATE["private"]), file_name), symbols)
        if lib is not None:
            return lib, ""
        lib, error = _compile(source, os.path.join(_build_dir(), file_name), cc, flags)
        if lib is not None:
            missing = _missing(lib, symbols)
            if not missing:
                return lib, ""
            error = f"the library lacks {', '.join(missing)}"
        reason = f"{cc} could not build {os.path.basename(source)}: {error}"
        if _STATE["stopped"]:   # the same for every source: the run's log says it once
            reason = f"{cc}: {_STATE['stopped']}"
            break
    return None, reason


def load(source: str, symbols: Sequence[str] = ()) -> Optional[ctypes.CDLL]:
    """The shared library built from the C file ``source`` (compiled once per source, flags
    and CPU, then cached and verified at every load) holding ``symbols``, or None when native
    kernels are off or it cannot be built."""
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
            lib, reason = _build_or_load(source, cc, symbols)
        _LOADED[source] = lib
        if lib is None:
            _REASONS[source] = reason
        return lib


def unavailable_reason(source: str) -> str:
    """Why :func:`load` returned None for ``source`` ('' when it loaded or was not tried)."""
    return _REASONS.get(os.path.abspath(source), "")


def forget(source: str) -> None:
    """Drop the cached load result of ``source`` and the process's compile state (tests
    switch the environment)."""
    with _LOCK:
        _LOADED.pop(os.path.abspath(source), None)
        _REASONS.pop(os.path.abspath(source), None)
        _STATE.update(spent=0.0, stopped="", private="", notes=[])


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
