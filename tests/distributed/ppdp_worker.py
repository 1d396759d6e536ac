"""msrun worker of the pipeline x data-parallel tests: every named case of
``ppdp_case.CASES`` on pp2 x dp2, then each resumable case's step-SAVE_AT checkpoint resumed
on the same layout.

    python tests/distributed/ppdp_worker.py OUT_DIR CASE...
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from ppdp_case import CASES, resume_extra, run_case  # noqa: E402


def main(out_dir: str, names) -> None:
    for name in names:
        run_case(name, os.path.join(out_dir, name), parallel=True)
    for name in names:
        if CASES[name]["resume"]:
            run_case(name, os.path.join(out_dir, f"{name}_resumed"), parallel=True,
                     extra=resume_extra(os.path.join(out_dir, name)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
