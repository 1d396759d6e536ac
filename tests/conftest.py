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
