"""msrun worker of the pipeline tests: every case of ``pp_case.CASES`` on 2 stages.

    python tests/distributed/pp_worker.py OUT_DIR CASE...
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from pp_case import run_case  # noqa: E402


def main(out_dir: str, names) -> None:
    for name in names:
        run_case(name, os.path.join(out_dir, name), pipeline=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
