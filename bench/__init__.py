"""Benchmarks of mindformers_core: ``python -m bench`` runs them all (see bench/run_all.py)."""
