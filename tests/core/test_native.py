"""optim/host/native.py: compile once, cache, load; every way it declines says why."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from mindformers_core.optim.host import native

needs_cc = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                              reason="no C compiler on this machine")

SOURCE = "int mfc_twice(int x) { return 2 * x; }\n"


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("MFC_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MFC_NATIVE_KERNELS", raising=False)
    path = tmp_path / "twice.c"
    path.write_text(SOURCE)
    yield str(path)
    native.forget(str(path))


def built(tmp_path):
    """The cached libraries (each has its digest beside it; nothing else is left)."""
    names = sorted(os.listdir(tmp_path / "cache" / "native"))
    libraries = [n for n in names if n.endswith(".so")]
    assert names == sorted(libraries + [native.digest_path(n) for n in libraries]), names
    return libraries


@needs_cc
def test_builds_once_and_loads_from_the_cache(source, tmp_path):
    lib = native.load(source)
    assert lib is not None and lib.mfc_twice(21) == 42
    assert native.unavailable_reason(source) == ""
    (first,) = built(tmp_path)
    assert first.startswith("twice-") and first.endswith(".so")
    stamp = os.stat(tmp_path / "cache" / "native" / first).st_mtime_ns
    native.forget(source)
    assert native.load(source).mfc_twice(4) == 8
    assert built(tmp_path) == [first]                       # no second build, no temp left
    assert os.stat(tmp_path / "cache" / "native" / first).st_mtime_ns == stamp


@needs_cc
def test_a_changed_source_is_a_new_library(source, tmp_path):
    native.load(source)
    native.forget(source)
    with open(source, "w", encoding="utf-8") as fh:
        fh.write("int mfc_twice(int x) { return 3 * x; }\n")
    assert native.load(source).mfc_twice(2) == 6
    assert len(built(tmp_path)) == 2


@needs_cc
def test_a_source_that_does_not_compile_is_declined_with_the_compiler_message(source):
    with open(source, "w", encoding="utf-8") as fh:
        fh.write("int mfc_twice(int x) { return 2 * x }\n")     # missing ';'
    assert native.load(source) is None
    reason = native.unavailable_reason(source)
    assert "could not build twice.c" in reason and "error" in reason


def test_no_compiler_is_declined_by_name(source, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/mfc-cc")
    assert native.load(source) is None
    assert native.unavailable_reason(source) == "no C compiler ('/nonexistent/mfc-cc' not found)"


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_switched_off_by_the_environment(source, monkeypatch, value):
    monkeypatch.setenv("MFC_NATIVE_KERNELS", value)
    assert native.load(source) is None
    assert native.unavailable_reason(source) == "MFC_NATIVE_KERNELS is off"


@needs_cc
def test_ranks_building_at_once_all_load_a_whole_library(source, tmp_path):
    """msrun workers start together: each builds to a temporary name and renames it."""
    code = textwrap.dedent(f"""
        from mindformers_core.optim.host import native
        lib = native.load({source!r})
        print(lib.mfc_twice(5) if lib is not None else native.unavailable_reason({source!r}))
    """)
    env = dict(os.environ, MFC_NATIVE_CACHE=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=env) for _ in range(4)]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["10"] * 4
    assert len(built(tmp_path)) == 1



def test_a_missing_source_is_declined_by_path(tmp_path, monkeypatch):
    monkeypatch.setenv("MFC_NATIVE_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "gone.c")
    try:
        assert native.load(missing) is None
        assert native.unavailable_reason(missing) == f"no C source {missing}"
    finally:
        native.forget(missing)


# --- a damaged, foreign or unwritable cache, a hung compiler (issue 33 item 6) ---------------

RUN_ONCE = textwrap.dedent("""
    import sys
    from mindformers_core.optim.host import native
    lib = native.load(sys.argv[1], ("mfc_twice",))
    print(lib.mfc_twice(5) if lib is not None else native.unavailable_reason(sys.argv[1]))
""")


def load_in_a_new_process(source, tmp_path, **env):
    """``native.load`` in a fresh process (the dynamic loader has seen no library yet)."""
    return subprocess.run([sys.executable, "-c", RUN_ONCE, source], capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, MFC_NATIVE_CACHE=str(tmp_path / "cache"), **env))


def cached(tmp_path):
    (name,) = built(tmp_path)
    return str(tmp_path / "cache" / "native" / name)


def sha256(path):
    import hashlib
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def damage(path, change):
    """Replace the cached file by a damaged copy. A new inode: this process has the library
    mapped, and truncating or writing the mapped file in place would crash this process
    (SIGBUS) when it next touches those pages, at exit at the latest; the next process sees
    the damaged file either way."""
    with open(path, "rb") as fh:
        data = change(fh.read())
    with open(path + ".damaged", "wb") as fh:
        fh.write(data)
    os.replace(path + ".damaged", path)


@needs_cc
def test_a_flipped_bit_in_the_cached_library_is_rebuilt_before_loading(source, tmp_path):
    assert native.load(source, ("mfc_twice",)).mfc_twice(1) == 2
    path = cached(tmp_path)
    good = sha256(path)
    with open(native.digest_path(path), encoding="ascii") as fh:
        assert fh.read() == good + "\n"
    def flip(data):                        # one bit, in the middle of the code
        mid = len(data) // 2
        return data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1:]
    damage(path, flip)
    assert sha256(path) != good
    proc = load_in_a_new_process(source, tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "10"), proc.stderr
    assert built(tmp_path) == [os.path.basename(path)] and sha256(path) == good


@needs_cc
def test_a_truncated_cached_library_is_rebuilt_not_a_sigbus(source, tmp_path):
    assert native.load(source, ("mfc_twice",)) is not None
    path = cached(tmp_path)
    good = sha256(path)
    damage(path, lambda data: data[:len(data) // 2])
    proc = load_in_a_new_process(source, tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "10"), proc.stderr
    assert sha256(path) == good


@needs_cc
def test_a_library_without_its_digest_is_rebuilt(source, tmp_path):
    native.load(source, ("mfc_twice",))
    path = cached(tmp_path)
    os.remove(native.digest_path(path))
    stamp = os.stat(path).st_ino
    proc = load_in_a_new_process(source, tmp_path)
    assert proc.stdout.strip() == "10"
    assert os.stat(path).st_ino != stamp and os.path.exists(native.digest_path(path))


@needs_cc
def test_a_wrong_library_with_a_matching_digest_is_rebuilt(source, tmp_path):
    """A loadable library lacking the kernel's symbol (its own digest recorded) is not
    bound (which raised AttributeError): it is rebuilt."""
    native.load(source, ("mfc_twice",))
    path = cached(tmp_path)
    other = tmp_path / "other.c"
    other.write_text("int mfc_other(int x) { return x; }\n")
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", str(other), "-o", path],
                   check=True)
    with open(native.digest_path(path), "w", encoding="ascii") as fh:
        fh.write(sha256(path) + "\n")
    proc = load_in_a_new_process(source, tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "10"), proc.stderr


@needs_cc
def test_a_source_lacking_a_symbol_is_declined_by_name(source):
    assert native.load(source, ("mfc_twice", "mfc_thrice")) is None
    assert native.unavailable_reason(source).endswith(
        "could not build twice.c: the library lacks mfc_thrice")


@needs_cc
def test_an_unwritable_cache_builds_in_a_private_directory_and_says_so(source, tmp_path,
                                                                        monkeypatch):
    """As root a read-only directory is still writable, so the cache path lies under a
    regular file: it can be neither created nor written."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MFC_NATIVE_CACHE", str(blocker / "cache"))
    lib = native.load(source, ("mfc_twice",))
    assert lib is not None and lib.mfc_twice(3) == 6
    (note,) = native.cache_notes()
    assert note.startswith(f"cache {blocker / 'cache' / 'native'} not writable (Not a "
                           "directory); built in ")
    private = note.rsplit(" ", 1)[1]
    assert [n for n in os.listdir(private) if n.endswith(".so")]


def fake_compiler(tmp_path, seconds=60):
    """A ``$CC`` that hangs (writing its pid first)."""
    script = tmp_path / "hung-cc"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'cc.pid'}\nexec sleep {seconds}\n")
    script.chmod(0o755)
    return str(script)


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as fh:       # a zombie of another parent counts as gone
        return fh.read().split()[2] == "Z"


def test_a_hung_compiler_is_killed_when_the_budget_of_all_compiles_is_spent(source, tmp_path,
                                                                             monkeypatch):
    import time
    monkeypatch.setenv("CC", fake_compiler(tmp_path))
    monkeypatch.setenv("MFC_NATIVE_COMPILE_BUDGET", "1.5")
    other = tmp_path / "other.c"
    other.write_text(SOURCE)
    t0 = time.monotonic()
    try:
        assert native.load(source) is None
        assert native.load(str(other)) is None       # the budget is for all compiles together
        assert time.monotonic() - t0 < 5
        assert native.unavailable_reason(source) == native.unavailable_reason(str(other)) == (
            f"{fake_compiler(tmp_path)}: compiling ran past its 1.5 s budget")
    finally:
        native.forget(str(other))
    assert gone(int((tmp_path / "cc.pid").read_text()))


SIGTERM_DURING_COMPILE = textwrap.dedent("""
    import signal, sys, time
    from mindformers_core.optim.host import native
    if sys.argv[2] == "handler":
        signal.signal(signal.SIGTERM, lambda s, f: print("stop requested", flush=True))
    t0 = time.monotonic()
    lib = native.load(sys.argv[1])
    print(f"{lib} {time.monotonic() - t0:.1f} {native.unavailable_reason(sys.argv[1])}")
""")


@pytest.mark.timed
@pytest.mark.parametrize("handler", ["handler", "default"])
def test_sigterm_during_a_compile_kills_the_compiler_and_reaches_the_handler(source, tmp_path,
                                                                             handler):
    import signal
    import time
    cc = fake_compiler(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_DURING_COMPILE, source, handler],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CC=cc, MFC_NATIVE_CACHE=str(tmp_path / "c")))
    pid_file = tmp_path / "cc.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=10)
    assert gone(int(pid_file.read_text()))
    if handler == "default":
        assert proc.returncode == -signal.SIGTERM
        return
    lines = out.splitlines()
    assert proc.returncode == 0 and lines[0] == "stop requested", out + err
    lib, seconds, reason = lines[1].split(" ", 2)
    assert lib == "None" and float(seconds) < 5
    assert reason == f"{cc}: compile interrupted by SIGTERM"


def test_a_compiler_killed_by_a_signal_ends_compiling(source, tmp_path, monkeypatch):
    """Ctrl-C in a terminal reaches the compiler (same process group) as well as the run."""
    script = tmp_path / "killed-cc"
    script.write_text("#!/bin/sh\nkill -INT $$\n")
    script.chmod(0o755)
    monkeypatch.setenv("CC", str(script))
    assert native.load(source) is None
    assert native.unavailable_reason(source) == f"{script}: the compiler was killed by SIGINT"
