"""Test-session setup shared by every test package.

Synchronous PyNative dispatch is switched on once, at collection time, for the whole session:
MindSpore only honours it fully when it is set before the first op of the process, it cannot be
switched off again, and the trainer turns it on for every CPU run anyway (it removes ~4 ms of
async-pipeline latency per dependent op on CPU; see mindformers_core.trainer.run).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mindformers_core.trainer.run import apply_pynative_synchronize  # noqa: E402

apply_pynative_synchronize(True)

# Property tests draw the same examples on every run (CI must be reproducible; explore with
# more/random examples offline: HYPOTHESIS_PROFILE=explore).
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# The msrun layout-matrix harness (tests/distributed/layout_matrix.py): one launch per world
# size for the cases of every collected module that names its groups in LAYOUT_GROUPS.
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def layout_matrix(request, tmp_path_factory):
    for sub in ("models", "distributed"):   # the case and worker modules
        path = os.path.join(ROOT, "tests", sub)
        if path not in sys.path:
            sys.path.insert(0, path)
    from layout_cases import groups
    from layout_matrix import LayoutMatrix, needed_groups
    return LayoutMatrix(groups(), needed_groups(request.session.items),
                        str(tmp_path_factory.mktemp("layout_matrix")))


# The README's test command runs the suite on two pytest-xdist workers (`-n 2 --dist
# loadgroup`): a single-process test keeps about one core busy, so two of them fill the 2-core
# machine. Every msrun test joins one group, "msrun", so one worker makes the launches one after
# another (one launch per world size through ``layout_matrix``; never two msrun jobs at once),
# and that group is collected first so its worker starts on it while the other worker takes the
# single-process modules. The tests that bound a wall-clock time (``timed``) join the same
# group: they never run beside a launch. Every other module stays whole on one worker (its
# module-scoped fixtures are built once). Without xdist the marks change nothing.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    def serial(item):
        return bool(item.get_closest_marker("multiproc") or item.get_closest_marker("timed"))

    for item in items:
        item.add_marker(pytest.mark.xdist_group("msrun" if serial(item)
                                                else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: not serial(item))   # stable: the order within each part stays
