"""msrun worker of the pipeline tests: every case of ``pp_case.CASES`` on 2 stages, then the
checkpoint of ``RESUME_CASE`` resumed on the same 2 stages.

    python tests/distributed/pp_worker.py OUT_DIR CASE...
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from pp_case import RESUME_CASE, resume_extra, run_case  # noqa: E402


def main(out_dir: str, names) -> None:
    for name in names:
        run_case(name, os.path.join(out_dir, name), pipeline=True)
    if RESUME_CASE in names:   # the pp2 checkpoint of the run above, resumed on pp2
        run_case(RESUME_CASE, os.path.join(out_dir, f"{RESUME_CASE}_resumed"), pipeline=True,
                 extra=resume_extra(os.path.join(out_dir, RESUME_CASE)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
