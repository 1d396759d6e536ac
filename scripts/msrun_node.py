"""MindSpore's msrun, with two changes the launcher (scripts/msrun_launcher.sh) relies on.

1. ``--node_rank`` alone decides which node runs the scheduler. msrun starts one on every node
   whose addresses include ``--master_addr``; two nodes of a job on one host (both at
   127.0.0.1: a test, or a workstation running two launchers) would both start one, the second
   fails to listen on MASTER_PORT and its msrun reports a failed job although training
   finished. Here node 0 (or -1: msrun assigns the ranks, one node) runs it and no other node
   does; the launcher checks that node 0 owns MASTER_ADDR.
2. The scheduler logs MindSpore's warnings (GLOG_v 2) to its own LOG_DIR/scheduler.log while
   the workers keep the launcher's GLOG_v: its "The new node: R ... ip: A is registered"
   lines tell the launcher which ranks joined when the cluster does not form in
   CLUSTER_TIME_OUT.

    python scripts/msrun_node.py MSRUN_ARGUMENTS...
"""
import os
import sys

from mindspore.parallel.cluster import run as msrun
from mindspore.parallel.cluster.process_entity import _api as msrun_api

SCHEDULER_GLOG_V = 2


def main() -> None:
    args = msrun.get_args()
    runs_scheduler = args.node_rank in (0, -1)
    # pylint: disable=protected-access
    msrun_api._is_local_ip = lambda _address: runs_scheduler
    start = msrun_api._MetaServerNode.run

    def start_scheduler(node):
        level = os.environ.get("GLOG_v")
        os.environ["GLOG_v"] = str(min(int(level or SCHEDULER_GLOG_V), SCHEDULER_GLOG_V))
        try:
            return start(node)
        finally:
            if level is None:
                os.environ.pop("GLOG_v", None)
            else:
                os.environ["GLOG_v"] = level

    msrun_api._MetaServerNode.run = start_scheduler
    msrun.run(args)


if __name__ == "__main__":
    sys.exit(main())
