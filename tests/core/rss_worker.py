"""Child process of the memory-planner RSS test: train a config for a few steps through the
CLI, then print this process's peak resident set (``VmHWM`` of /proc/self/status, kB) as JSON.

    python tests/core/rss_worker.py CONFIG.yaml OUTPUT_DIR [--set KEY=VALUE ...]
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def peak_rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv):
    import run_mindformer
    config, out_dir, rest = argv[0], argv[1], argv[2:]
    code = run_mindformer.main(["--config", config, "--mode", "1", "--output_dir", out_dir]
                               + rest)
    print(json.dumps({"rc": code, "peak_rss": peak_rss_bytes()}))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
