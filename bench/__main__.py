"""``python -m bench``: run every benchmark script and print one table (bench/run_all.py)."""
import sys

from bench.run_all import main

sys.exit(main())
