"""Synchronous PyNative dispatch for the trainer tests, set at collection time: MindSpore only
honours it fully when it is set before the first op of the process (see
``mindformers_core.trainer.run.choose_pynative_synchronize``), and the trainer turns it on
for every CPU run anyway."""
from mindformers_core.trainer.run import apply_pynative_synchronize

apply_pynative_synchronize(True)
