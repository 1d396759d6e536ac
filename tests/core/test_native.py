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
    return sorted(os.listdir(tmp_path / "cache" / "native"))


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
