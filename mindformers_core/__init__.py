"""mindformers_core: MindSpore-native PyNative training module for LLM pretraining.

Importing the package is cheap: subpackages that need MindSpore import it themselves, so
config validation (`run_mindformer.py --check`) stays fast.
"""
__version__ = "0.1.0"
