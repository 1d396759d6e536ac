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
