"""msrun worker of the layout-matrix harness (``layout_matrix.py``): every case of a plan, in
order, in this one process (one communication init for all of them).

    python tests/distributed/layout_worker.py PLAN_JSON

PLAN_JSON: a list of ``{"name", "dir", "target": "module:function", "args"}``. Each case runs
``function(dir, *args)``, then the ranks meet at a barrier and each writes
``dir/.done.rank{r}`` (its seconds). A case that raises leaves its traceback in
``dir/.error.rank{r}`` and ends this worker with status 1 (the launcher then ends the job:
a peer of a failed rank would wait in its next collective).
"""
import importlib
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "models"))
sys.path.insert(0, HERE)


def main(plan_path: str) -> int:
    import mindspore as ms
    from mindformers_core.distributed.comm import init_distributed

    ms.runtime.launch_blocking()     # synchronous dispatch: the fast mode on CPU
    comm = init_distributed()        # msrun's scheduler process exits here
    with open(plan_path) as fh:
        plan = json.load(fh)
    for entry in plan:
        os.makedirs(entry["dir"], exist_ok=True)
        module, function = entry["target"].split(":")
        t0 = time.monotonic()
        print(f"layout case {entry['name']}: start", flush=True)
        try:
            ms.set_context(mode=ms.PYNATIVE_MODE)
            getattr(importlib.import_module(module), function)(entry["dir"], *entry["args"])
            comm.barrier()
        except BaseException:
            with open(os.path.join(entry["dir"], f".error.rank{comm.rank}"), "w") as fh:
                fh.write(traceback.format_exc())
            print(f"layout case {entry['name']}: FAILED\n{traceback.format_exc()}", flush=True)
            return 1
        seconds = time.monotonic() - t0
        with open(os.path.join(entry["dir"], f".done.rank{comm.rank}"), "w") as fh:
            json.dump({"seconds": seconds}, fh)
        print(f"layout case {entry['name']}: done in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
