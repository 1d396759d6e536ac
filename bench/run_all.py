"""Run every benchmark script in bench/ and print one summary table.

    python -m bench                 # quick mode (well under 10 minutes on 2 cores)
    python -m bench --full          # each script's default (longer) settings
    python -m bench --only train,check
    python -m bench --save          # record the results in the tracked bench/results/
    python bench/run_all.py --list

Each ``bench/bench_*.py`` runs in its own interpreter (MindSpore's context and synchronous
dispatch are process-wide), writes its own ``<results>/<name>.json``, and is summarised
here into rows ``bench | case | metric | value``. The table is also written to
``<results>/summary.json`` with the date, the machine and each script's wall time and exit
code. ``<results>`` is ``output/bench/`` (untracked, so a run never changes the repository),
``bench/results/`` (the tracked record the docs quote) with ``--save``, or ``--results DIR``. A script that fails or times out is reported in the table; the others still run.
Scripts without an entry in ``QUICK_ARGS`` get ``--quick`` when their ``--help`` offers it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:   # run as python bench/run_all.py
    sys.path.insert(0, ROOT)

from bench.output import SAVED_DIR, SCRATCH_DIR  # noqa: E402

BENCH_DIR = os.path.join(ROOT, "bench")
SAVED_RESULTS = SAVED_DIR          # tracked: written with --save only
SCRATCH_RESULTS = SCRATCH_DIR      # untracked (.gitignore: output/)
RESULTS = SCRATCH_RESULTS

#: quick-mode arguments per script (what keeps the whole run under 10 minutes on 2 cores)
QUICK_ARGS: Dict[str, List[str]] = {
    "lr": ["--calls", "2000"],
    "optimizer": ["--sizes", "1e6", "1e7", "--repeats", "3", "--bandwidth-mb", "128"],
    "muon": ["--rounds", "1"],
    "train": ["--quick"],
    "check": ["--quick"],
    "dp": ["--measure"],
}
#: the order the table lists them in (others follow, alphabetically)
ORDER = ["optimizer", "adamw_torch", "muon", "train", "check", "lr", "dp"]

Row = Dict[str, object]


def discover() -> Dict[str, str]:
    """``name -> script path`` for every bench/bench_*.py (name without the prefix)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(BENCH_DIR, "bench_*.py"))):
        found[os.path.basename(path)[len("bench_"):-3]] = path
    ordered = [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)
    return {n: found[n] for n in ordered}


def _help_text(script: str) -> str:
    try:
        proc = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return ""
    return proc.stdout


def script_args(name: str, script: str, full: bool) -> List[str]:
    """The script's arguments: quick settings unless ``full``, and ``--out`` to its result file
    (scripts outside ``QUICK_ARGS`` get the flags their ``--help`` offers)."""
    if name in QUICK_ARGS:
        quick = list(QUICK_ARGS[name])
        if full and name == "dp":
            quick = ["--measure"]      # its defaults skip the measured 2-worker run
        elif full:
            quick = []
        return quick + ["--out", result_file(name)]
    text = _help_text(script)
    args = [] if full or "--quick" not in text else ["--quick"]
    return args + (["--out", result_file(name)] if "--out" in text else [])


# --------------------------------------------------------------------------- summaries
def _row(bench: str, case: str, metric: str, value, unit: str = "", note: str = "") -> Row:
    return {"bench": bench, "case": case, "metric": metric, "value": value, "unit": unit,
            "note": note}


def _sum_optimizer(d: dict) -> List[Row]:
    rows = []
    for r in d.get("rows", []):
        case = f"AdamW {r['params'] / 1e6:.0f}M params, {r['mode']}"
        rows.append(_row("optimizer", case, "step", r["ours_ns_per_param"], "ns/param",
                         f"{r['ratio_to_nn_adam']:.2f}x MindSpore nn.Adam (fused), "
                         f"{r['ratio_to_bandwidth_bound']:.1f}x bandwidth bound"))
    for mode, b in (d.get("state_bytes_per_param") or {}).items():
        rows.append(_row("optimizer", mode, "state bytes", b, "B/param"))
    return rows


def _sum_adamw_torch(d: dict) -> List[Row]:
    return [_row("adamw_torch", f"AdamW {r['params'] / 1e6:.0f}M fp32 params (GPT shapes), "
                 f"{r['threads']} thread(s)", "step", r["ours_ns_per_param"], "ns/param",
                 f"{r['ratio_to_torch_fused']:.2f}x torch fused AdamW, "
                 f"{r['ratio_to_torch_foreach']:.2f}x foreach")
            for r in d.get("rows", [])]


def _sum_muon(d: dict) -> List[Row]:
    rows = []
    for r in d.get("shapes", []):
        shape = "x".join(map(str, r["shape"]))
        rows.append(_row("muon", f"Newton-Schulz {shape} fp32", "throughput", r["ns_gflops"],
                         "GFLOP/s", f"{r['ns_over_matmul_mix']:.2f}x of MindSpore fp32 matmul; "
                         f"numpy {r['numpy_gflops']:.1f}"))
    tiny = d.get("tiny_deepseek_v3")
    if tiny:
        rows.append(_row("muon", "tiny DeepSeek-V3 Muon.step", "step", 1e3 * tiny["muon_step_time_s"],
                         "ms", f"{tiny.get('num_pieces', '?')} NS pieces"))
    return rows


def _sum_train(d: dict) -> List[Row]:
    rows = []
    for r in d.get("results", []):
        ph = r["phase_ms_median"]
        rows.append(_row("train", r["config"], "step", r["step_ms"], "ms",
                         f"{r['tokens_per_s']:.0f} tok/s; fwd+bwd {ph['fwd_bwd']:.1f}, "
                         f"optimizer {ph['optimizer']:.1f}, data {ph['data']:.1f}, "
                         f"norm {ph['grad_norm']:.1f}, log {ph['logging']:.2f} ms"))
        rows.append(_row("train", r["config"], "trainer overhead",
                         r["trainer_overhead_pct_median"], "% of step",
                         f"target < {r['overhead_target_pct']:.0f}%; "
                         f"{r['trainer_overhead_pct_amortised']:.1f}% amortised incl. checkpoint"
                         + (f"; {r['trainer_overhead_pct_with_concat_norm']:.1f}% with a one-kernel "
                            f"grad norm ({r['concat_norm_ms_median']:.1f} vs {ph['grad_norm']:.1f} ms)"
                            if "trainer_overhead_pct_with_concat_norm" in r else "")))
    for name, why in (d.get("skipped") or {}).items():
        rows.append(_row("train", name, "skipped", None, "", why[:80]))
    return rows


def _sum_check(d: dict) -> List[Row]:
    return [_row("check", r["config"], "--check wall", r["check_s"], "s",
                 f"python start-up {r['python_startup_s']:.2f} s; MindSpore "
                 f"{'imported' if r['imports_mindspore'] else 'not imported'}")
            for r in d.get("results", [])]


def _sum_lr(d: dict) -> List[Row]:
    res = [r for r in d.get("results", []) if not r["schedule"].startswith("group_lrs")]
    if not res:
        return []
    worst = max(res, key=lambda r: r["us_per_call"])
    return [_row("lr", "lr_at, slowest schedule", "per call", worst["us_per_call"], "us",
                 f"{worst['schedule']}; target < {d.get('target_us', 5)} us"
                 f"{'' if d.get('within_target', True) else ', MISSED'}")]


def _sum_generic(name: str, d) -> List[Row]:
    """Scalars at the top level, and each row of a list of results with its first numbers."""
    rows = []
    if isinstance(d, dict):
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                rows.append(_row(name, "-", k, v))
            elif isinstance(v, list):
                for item in v[:12]:
                    if isinstance(item, dict):
                        label = ", ".join(f"{a}={b}" for a, b in item.items()
                                          if isinstance(b, (str, int)) and not isinstance(b, bool))[:60]
                        nums = [(a, b) for a, b in item.items()
                                if isinstance(b, float)]
                        for a, b in nums[:3]:
                            rows.append(_row(name, label or k, a, b))
    return rows


def _sum_dp(d: dict) -> List[Row]:
    rows = []
    model_rows = d.get("model_rows", [])
    base = None
    for entry in model_rows:
        ranks = entry["ranks"]
        w = entry["world"]
        state = max(r["adamw_state_bytes"] for r in ranks)
        base = state if w == 1 else base
        ratio = f"{state / base:.2f}x of 1 rank; " if base else ""
        ag = max(r["ns_flops_allgather"] for r in ranks) / 1e9
        dr = max(r["ns_flops_deredundency"] for r in ranks) / 1e9
        rows.append(_row("dp", f"{d.get('model', '?')}, {w} ranks", "AdamW state/rank",
                         state / 2 ** 20, "MiB", f"{ratio}ZeRO-1 (model)"))
        if w > 1:
            rows.append(_row("dp", f"{d.get('model', '?')}, {w} ranks", "Muon NS/rank", dr, "GFLOP",
                             f"allgather_deredundency; allgather {ag:.4f} GFLOP (model)"))
    measured = d.get("measured_2_workers") or {}
    rank0 = measured.get("0") or measured.get(0) or {}
    for strategy, m in rank0.items():
        rows.append(_row("dp", f"2 msrun CPU workers, {strategy}", "received/step/rank",
                         m["bytes"] / 2 ** 20, "MiB",
                         f"measured; state {m['state_bytes'] / 2 ** 20:.3f} MiB, "
                         f"NS {m['ns_flops'] / 1e9:.4f} GFLOP"))
    return rows


SUMMARIZERS: Dict[str, Callable[[dict], List[Row]]] = {
    "optimizer": _sum_optimizer, "adamw_torch": _sum_adamw_torch, "muon": _sum_muon, "train": _sum_train, "check": _sum_check,
    "lr": _sum_lr, "dp": _sum_dp,
}


def result_file(name: str) -> str:
    return os.path.join(RESULTS, f"{name}.json")


def summarize(name: str, started: float) -> List[Row]:
    path = result_file(name)
    if not os.path.exists(path) or os.path.getmtime(path) < started:
        return [_row(name, "-", "no result", None, "", f"{os.path.relpath(path, ROOT)} not written")]
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    fn = SUMMARIZERS.get(name)
    return fn(data) if fn else _sum_generic(name, data)


# --------------------------------------------------------------------------- table
def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def format_table(rows: List[Row]) -> str:
    head = ("bench", "case", "metric", "value", "unit", "note")
    cells = [[str(r["bench"]), str(r["case"]), str(r["metric"]), _fmt(r["value"]),
              str(r["unit"]), str(r["note"])] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head[:-1])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head[:-1], widths)) + "  note"]
    for c in cells:
        lines.append("  ".join(x.ljust(w) for x, w in zip(c[:-1], widths)) + "  " + c[-1])
    return "\n".join(lines)


def format_markdown(rows: List[Row]) -> str:
    lines = ["| bench | case | metric | value | unit | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bench']} | {r['case']} | {r['metric']} | {_fmt(r['value'])} | "
                     f"{r['unit']} | {r['note']} |")
    return "\n".join(lines)


def _previous_summary() -> dict:
    path = os.path.join(RESULTS, "summary.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def print_summary_markdown() -> int:
    data = _previous_summary()
    if not data:
        print("no bench/results/summary.json: run python -m bench first", file=sys.stderr)
        return 1
    print(f"Measured {data['date']} (last update) on {data['machine']} ({data['mode']} mode; "
          f"the scripts ran {data['total_s']:.0f} s in all).")
    print()
    print(format_markdown(data["rows"]))
    return 0


def run_one(name: str, script: str, args: List[str], timeout: float) -> dict:
    cmd = [sys.executable, script] + args
    t0 = time.time()
    print(f"== {name}: {' '.join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:])}",
          flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = "timeout", f"killed after {timeout:.0f} s"
    wall = time.time() - t0
    print(f"   exit {code} in {wall:.0f} s", flush=True)
    if code not in (0, 1):   # 1: a bench whose target was not met still wrote its results
        print("   " + tail.replace("\n", "\n   "), flush=True)
    return {"name": name, "exit": code, "wall_s": wall, "started": t0}


def main(argv: Optional[List[str]] = None) -> int:
    global RESULTS
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="each script's default (longer) settings")
    ap.add_argument("--only", default=None, help="comma-separated names (e.g. train,check)")
    ap.add_argument("--list", action="store_true", help="list the scripts and their quick args")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per script")
    ap.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    ap.add_argument("--from-summary", action="store_true",
                    help="run nothing: print bench/results/summary.json as a Markdown table")
    ap.add_argument("--save", action="store_true",
                    help="write the results into the tracked bench/results/ (default: "
                         "output/bench/, untracked)")
    ap.add_argument("--results", default=None, help="directory of the JSON results (overrides "
                                                     "--save)")
    args = ap.parse_args(argv)
    saved = args.save or args.from_summary
    RESULTS = os.path.abspath(args.results or (SAVED_RESULTS if saved else SCRATCH_RESULTS))
    if args.from_summary:
        return print_summary_markdown()
    scripts = discover()
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in scripts]
        if unknown:
            ap.error(f"unknown bench {unknown}; available: {list(scripts)}")
        scripts = {n: scripts[n] for n in wanted}
    if args.list:
        for name, path in scripts.items():
            print(f"{name:<10} {os.path.relpath(path, ROOT)} "
                  f"{' '.join(QUICK_ARGS.get(name, ['(--quick if offered)']))}")
        return 0
    os.makedirs(RESULTS, exist_ok=True)
    t_all = time.time()
    runs, rows = [], []
    for name, path in scripts.items():
        info = run_one(name, path, script_args(name, path, args.full), args.timeout)
        info["mode"] = "full" if args.full else "quick"
        runs.append(info)
        try:
            rows.extend(summarize(name, info["started"]))
        except (KeyError, TypeError, ValueError) as exc:
            rows.append(_row(name, "-", "unreadable result", None, "", str(exc)[:80]))
    total = time.time() - t_all
    previous = _previous_summary()
    ran = set(scripts)
    kept_rows = [r for r in previous.get("rows", []) if r["bench"] not in ran]
    kept_runs = [r for r in previous.get("scripts", []) if r["name"] not in ran]
    if kept_rows:   # --only: keep the other benches' rows of the last summary
        rows = kept_rows + rows
        order = list(discover())
        rows.sort(key=lambda r: order.index(r["bench"]) if r["bench"] in order else len(order))
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    machine = (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
               f"Python {platform.python_version()}")
    try:
        import mindspore
        machine += f", MindSpore {mindspore.__version__}"
    except ImportError:
        pass
    print()
    print(f"mindformers_core benchmarks ({'full' if args.full else 'quick'} mode), {stamp}, "
          f"{machine}; total {total:.0f} s")
    print(format_table(rows))
    if args.markdown:
        print()
        print(format_markdown(rows))
    with open(os.path.join(RESULTS, "summary.json"), "w", encoding="utf-8") as fh:
        modes = sorted({r.get("mode", "quick") for r in kept_runs + runs})
        json.dump({"date": stamp, "machine": machine, "mode": "/".join(modes),
                   "total_s": total if not kept_runs else
                   sum(r["wall_s"] for r in kept_runs + runs),
                   "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   "scripts": kept_runs + [{k: v for k, v in r.items() if k != "started"}
                                           for r in runs],
                   "rows": rows}, fh, indent=2)
    print(f"wrote {os.path.join(RESULTS, 'summary.json')}")
    return 0 if all(r["exit"] in (0, 1) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
