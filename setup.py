"""mindformers_core: MindSpore-native PyNative training for LLM pretraining."""
from setuptools import find_packages, setup

setup(
    name="mindformers_core",
    version="0.1.0",
    description="MindSpore-native PyNative LLM pretraining: strict config, LR schedules, "
                "AdamW/Muon with fp32 masters, data parallel over msrun.",
    python_requires=">=3.9",
    packages=find_packages(include=["mindformers_core", "mindformers_core.*"]),
    py_modules=["run_mindformer"],
    # the host C kernels are compiled at first use (mindformers_core/optim/host/native.py)
    package_data={"": ["*.c"]},
    install_requires=[
        "mindspore==2.10.0",
        "numpy>=1.24,<2",
        "pyyaml>=6",
        "safetensors>=0.4",
    ],
    extras_require={
        # plots, hf tokenizers and TensorBoard files are tested too; the README's test command
        # runs on two pytest-xdist workers (tests/conftest.py groups the msrun tests)
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "matplotlib>=3.5",
                 "tokenizers>=0.15", "tensorboardX>=2.6"],
        "plot": ["matplotlib>=3.5"],
        "hf": ["tokenizers>=0.15"],
        "tensorboard": ["tensorboardX>=2.6"],
        "bench": ["torch==2.13.0"],  # bench/bench_peer.py only; never imported by the package
    },
    entry_points={"console_scripts": ["mindformers-run=run_mindformer:cli"]},
)
