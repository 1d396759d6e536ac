#!/usr/bin/env bash
# Launch a command on N workers with MindSpore's own launcher, msrun.
#
# Call forms (as MindFormers' launcher):
#   bash scripts/msrun_launcher.sh "CMD"
#   bash scripts/msrun_launcher.sh "CMD" WORKER_NUM
#   bash scripts/msrun_launcher.sh "CMD" WORKER_NUM MASTER_PORT LOG_DIR JOIN CLUSTER_TIME_OUT
#   bash scripts/msrun_launcher.sh "CMD" WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK LOG_DIR JOIN CLUSTER_TIME_OUT
#
# Without WORKER_NUM: the visible NPUs (ASCEND_RT_VISIBLE_DEVICES, else /dev/davinciN), and 1 on
# a host without NPUs (the CPU backend). One worker runs the command directly: a single process
# needs no communication init. Per-worker logs go to LOG_DIR/worker_N.log; LOG_DIR defaults to
# <--output_dir of CMD>/msrun_log (./output/msrun_log when CMD names none).
# Environment: MASTER_PORT, LOG_DIR, JOIN, CLUSTER_TIME_OUT override the defaults below;
# GLOG_v (default 3: MindSpore's C++ and Python logs at ERROR and above) for the workers.
#
# Difference from MindFormers: JOIN defaults to True, so the launcher waits for the job.
# * When a worker dies, msrun stops the other workers; the launcher then also stops msrun's
#   scheduler (which would wait ~30 s for its node timeout), names the failing rank, how it
#   ended and its first error line, and exits with that worker's code (128+N for signal N).
# * SIGTERM/SIGINT/SIGHUP to the launcher, or Ctrl-C to its whole process group, is passed to
#   every worker as SIGTERM (msrun itself would SIGKILL them on SIGINT and leave them running
#   on SIGTERM; msrun runs in its own session so a terminal's signal reaches only the
#   launcher): the trainer finishes its step, saves a checkpoint and exits 0, and so does the
#   launcher, as a single-process run stopped by Ctrl-C.
# * A rank that sends no heartbeat for MS_NODE_TIMEOUT s (default 8 here; a lost host, a
#   SIGSTOPped or hung process) is named from the scheduler's log on node 0: for a rank of
#   another node, that node (NODE_RANK and its ranks); the job is stopped at once.
# * A cluster that does not form in CLUSTER_TIME_OUT: node 0 names the nodes that did not join
#   and the master address and port.
# * Several nodes: the 9-argument form on every host; only NODE_RANK 0 starts the scheduler
#   (scripts/msrun_node.py), also when two nodes share a host. docs/multi_node.md.
# msrun's own output is kept in LOG_DIR/msrun_launcher.log; its traceback stays there.
set -u

usage() {
  cat >&2 <<'EOF'
usage: bash scripts/msrun_launcher.sh "CMD" [WORKER_NUM]
       bash scripts/msrun_launcher.sh "CMD" WORKER_NUM MASTER_PORT LOG_DIR JOIN CLUSTER_TIME_OUT
       bash scripts/msrun_launcher.sh "CMD" WORKER_NUM LOCAL_WORKER MASTER_ADDR MASTER_PORT NODE_RANK LOG_DIR JOIN CLUSTER_TIME_OUT
EOF
}

die() { echo "msrun_launcher: error: $*" >&2; exit 2; }

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

visible_npus() {
  if [ -n "${ASCEND_RT_VISIBLE_DEVICES:-}" ]; then
    echo "$ASCEND_RT_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .
    return
  fi
  local n
  n=$(ls /dev/davinci[0-9]* 2>/dev/null | wc -l)
  echo "${n:-0}"
}

port_in_use() {
  python3 - "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.bind(("0.0.0.0", int(sys.argv[1])))
except OSError:
    sys.exit(0)
finally:
    s.close()
sys.exit(1)
EOF
}

# Whether $1 (an address or host name) is an address of this host: node 0 runs the scheduler,
# which listens there.
is_local_address() {
  python3 - "$1" <<'EOF'
import socket, sys
try:
    addr = socket.gethostbyname(sys.argv[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
except OSError:
    sys.exit(1)
EOF
}

# Processes msrun started with MS_ROLE=$1 (MS_WORKER or MS_SCHED): children of the msrun
# process, which is a child of this launcher ($$ is the launcher in its subshells too).
msrun_children() {
  local m c
  for m in $(pgrep -P "$$" 2>/dev/null); do
    for c in $(pgrep -P "$m" 2>/dev/null); do
      if tr '\0' '\n' 2>/dev/null < "/proc/$c/environ" | grep -qx "MS_ROLE=$1"; then echo "$c"; fi
    done
  done
}

# While the job runs: "PID RANK" of every worker into LOG_DIR/.workers (a dead worker's pid
# names its rank afterwards; with GLOG_v=3 its log may hold no line with its pid).
record_workers() {
  local w r
  while kill -0 "$1" 2>/dev/null; do
    for w in $(msrun_children MS_WORKER); do
      grep -q "^$w " "$WORKERS_FILE" 2>/dev/null && continue
      r=$(tr '\0' '\n' 2>/dev/null < "/proc/$w/environ" | sed -n 's/^MS_NODE_ID=//p')
      [ -n "$r" ] && echo "$w $r" >> "$WORKERS_FILE"
    done
    sleep 0.3
  done
}

# Fail fast: once msrun has seen a worker die and killed the others, it still waits for the
# scheduler, which only gives up after its node timeout (~30 s). The job is lost by then, so
# stop the scheduler and let msrun report.
stop_scheduler() {
  local pid
  for pid in $(msrun_children MS_SCHED); do
    echo "msrun_launcher: ${1:-a worker failed}; stopping the scheduler (pid $pid) so the job ends now" >&2
    kill -TERM "$pid" 2>/dev/null || true
    # a scheduler that ignores SIGTERM (a user script's own handler) is killed 2 s later
    ( sleep 2; kill -KILL "$pid" 2>/dev/null ) &
  done
}

# SIGTERM/SIGINT to the launcher: pass SIGTERM to every worker (children of msrun with
# MS_ROLE=MS_WORKER; each leads its own process group) so each finishes its step and saves.
# A second signal is passed on again (the trainer then ends at once). Workers msrun has not
# started yet when the signal comes are signalled as they appear (STOPPING; the main loop).
STOPPING=""
SIGNALLED=" "
forward_stop() {
  local sig=$1
  echo "msrun_launcher: received SIG$sig; asking every worker to finish its step, save and exit" >&2
  [ -n "$STOPPING" ] && SIGNALLED=" "
  STOPPING=$sig
  signal_workers
}

# SIGTERM to every worker not yet signalled (each leads its own process group).
signal_workers() {
  local child
  for child in $(msrun_children MS_WORKER); do
    case "$SIGNALLED" in *" $child "*) continue;; esac
    kill -TERM -- "-$child" 2>/dev/null || kill -TERM "$child" 2>/dev/null || true
    SIGNALLED="$SIGNALLED$child "
  done
}

# The rank msrun's scheduler saw stop answering ("The node: R is timed out" in scheduler.log,
# after MS_NODE_TIMEOUT s without a heartbeat), and what that means here. A rank of another
# node: that node was lost (msrun gives every node LOCAL_WORKER consecutive ranks). A rank of
# this node: its process is stopped (SIGSTOP: state T) or hung. Prints the verdict; fails when
# the scheduler saw no timeout. (The healthy ranks fail afterwards in their collectives, and
# msrun would name the first of them.)
lost_verdict() {
  local r node first last pid state how
  r=$(grep -m1 -oE "The node: [0-9]+ is timed out" "$LOG_DIR/scheduler.log" 2>/dev/null \
      | awk '{print $3}')
  [ -n "$r" ] || return 1
  node=$(( r / LOCAL_WORKER ))
  if [ "$node" -ne "$NODE_RANK" ]; then
    first=$(( node * LOCAL_WORKER )); last=$(( first + LOCAL_WORKER - 1 ))
    echo "msrun_launcher: the job failed: node $node (NODE_RANK $node, ranks $first..$last) was lost:"\
         "its rank $r stopped answering the scheduler at $MASTER_ADDR:$MASTER_PORT for"\
         "$MS_NODE_TIMEOUT s (MS_NODE_TIMEOUT); see that host's LOG_DIR"
  else
    pid=$(awk -v r="$r" '$2 == r {print $1; exit}' "$WORKERS_FILE" 2>/dev/null)
    state=$(sed -E 's/.*\) ([A-Za-z]).*/\1/' "/proc/${pid:-0}/stat" 2>/dev/null)
    how="hung"
    case "$state" in T|t) how="stopped (SIGSTOP)";; esac
    echo "msrun_launcher: the job failed: rank $r stopped answering the scheduler for"\
         "$MS_NODE_TIMEOUT s (MS_NODE_TIMEOUT): its process is $how"
    echo "msrun_launcher: failing worker: rank $r (pid ${pid:-?}, $how); log: $LOG_DIR/worker_$r.log"
  fi
}

# On the master node while the job runs: once the scheduler names a timed-out rank the job is
# lost (no rank can finish a collective with it), so record the verdict and stop every local
# worker and the scheduler now; msrun would wait for a healthy rank's collective to fail.
watch_scheduler() {
  local v pid
  while kill -0 "$1" 2>/dev/null; do
    if v=$(lost_verdict); then
      printf '%s\n' "$v" > "$LOST_FILE"
      for pid in $(msrun_children MS_WORKER); do
        kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
      done
      stop_scheduler "the scheduler lost a rank"
      return
    fi
    sleep 0.5
  done
}

# The cluster never formed (a node did not join within CLUSTER_TIME_OUT): on node 0, which
# ranks the scheduler registered ("The new node: R(role: MS_WORKER) ... is registered") and so
# which nodes are missing; on another node, that the scheduler was not reached. Prints the
# verdict; fails when the workers' logs show no failed cluster build.
formation_verdict() {
  local joined r node missing="" nodes_missing=0 listed=""
  grep -qs "Failed to initialize distributed job cluster" "$LOG_DIR"/worker_*.log || return 1
  if [ "$NODE_RANK" -ne 0 ]; then
    echo "msrun_launcher: the job failed: the cluster did not form within CLUSTER_TIME_OUT" \
         "$CLUSTER_TIME_OUT s: node $NODE_RANK (ranks $FIRST_RANK..$LAST_RANK) did not get the" \
         "whole job together at the scheduler $MASTER_ADDR:$MASTER_PORT (is node 0 running," \
         "and can this host reach that address?)"
    return 0
  fi
  joined=$(grep -oE "The new node: [0-9]+\(role: MS_WORKER\)" "$LOG_DIR/scheduler.log" 2>/dev/null \
           | grep -oE "[0-9]+" | sort -un)
  for (( node = 0; node < NODE_NUM; node++ )); do
    for (( r = node * LOCAL_WORKER; r < (node + 1) * LOCAL_WORKER; r++ )); do
      if ! grep -qx "$r" <<< "$joined"; then
        missing="$missing${missing:+, }NODE_RANK $node (ranks $(( node * LOCAL_WORKER ))..$(( (node + 1) * LOCAL_WORKER - 1 )))"
        nodes_missing=$(( nodes_missing + 1 ))
        break
      fi
    done
  done
  echo "msrun_launcher: the job failed: the cluster did not form within CLUSTER_TIME_OUT" \
       "$CLUSTER_TIME_OUT s: $(( NODE_NUM - nodes_missing )) of $NODE_NUM nodes joined the" \
       "scheduler at $MASTER_ADDR:$MASTER_PORT; $nodes_missing node(s) missing: ${missing:-none}" \
       "(start the launcher on every node with this MASTER_ADDR and MASTER_PORT)"
}

# After a failed job: name the worker that failed first (msrun logs "Worker process PID exit
# with exception. Error code: C"; the PID appears in that worker's log lines), how it ended
# (a negative code is the signal that killed it), and its first error line; else the worker the
# scheduler saw time out first; else every worker whose log holds a Python traceback.
# Sets WORKER_CODE to the failing worker's exit status (128+N for signal N) when known.
WORKER_CODE=""
# The error of a rank that stopped only because another rank failed (checkpoint/sharded_save.py)
FOLLOWER_ERROR="another rank could not write its part of checkpoint"
report_failure() {
  local status=$1 out="$LOG_DIR/msrun_launcher.log" line pid code f rank how named="" verdict
  # a rank the scheduler lost explains the job's end better than the first healthy rank whose
  # collective then failed
  if [ -s "$LOST_FILE" ] || verdict=$(lost_verdict); then
    [ -s "$LOST_FILE" ] && verdict=$(cat "$LOST_FILE")
    echo "$verdict" >&2
    return
  fi
  if verdict=$(formation_verdict); then
    echo "$verdict" >&2
    return
  fi
  line=$(grep -m1 -E "Worker process [0-9]+ exit with exception" "$out" 2>/dev/null)
  if [ -n "$line" ]; then
    pid=$(echo "$line" | sed -E 's/.*Worker process ([0-9]+) exit.*/\1/')
    code=$(echo "$line" | sed -nE 's/.*Error code: (-?[0-9]+).*/\1/p')
    how="exit code ${code:-?}"
    local what="ended with $how"
    WORKER_CODE=$code
    if [ -n "$code" ] && [ "$code" -lt 0 ]; then
      how="killed by signal $(( -code ))"
      what="was $how (SIG$(kill -l $(( -code )) 2>/dev/null || echo '?'))"
      WORKER_CODE=$(( 128 - code ))
    fi
    echo "msrun_launcher: the job failed: a worker $what." >&2
    rank=$(sed -n "s/^$pid //p" "$WORKERS_FILE" 2>/dev/null | head -n 1)
    if [ -z "$rank" ]; then
      for f in "$LOG_DIR"/worker_*.log; do
        if [ -f "$f" ] && grep -qE "\(${pid}[,:]" "$f"; then
          rank=$(basename "$f" .log); rank=${rank#worker_}
          break
        fi
      done
    fi
    if [ -n "$rank" ] && grep -qs "$FOLLOWER_ERROR" "$LOG_DIR/worker_$rank.log"; then
      # this rank only stopped because another failed (a checkpoint part it could not see
      # written): name the rank whose own error it was, when this node holds its log
      for f in $(ls "$LOG_DIR"/worker_*.log 2>/dev/null | sort -V); do
        if grep -qE "^(error|ERROR): " "$f" && ! grep -qs "$FOLLOWER_ERROR" "$f"; then
          echo "msrun_launcher: rank $rank (pid $pid, $how) stopped because another rank failed" >&2
          rank=$(basename "$f" .log); rank=${rank#worker_}
          pid=$(awk -v r="$rank" '$2 == r {print $1; exit}' "$WORKERS_FILE" 2>/dev/null)
          how="its own error"
          break
        fi
      done
    fi
    if [ -n "$rank" ]; then
      f="$LOG_DIR/worker_$rank.log"
      echo "msrun_launcher: failing worker: rank $rank (pid ${pid:-?}, $how); log: $f" >&2
      last_error "$f"
      named=1
    fi
  fi
  if [ -z "$line" ]; then
    echo "msrun_launcher: the job failed (exit $status)." >&2
  fi
  if [ -z "$named" ]; then
    line=$(grep -h -m1 -oE "worker [0-9]+ is the first one timed out" "$LOG_DIR/scheduler.log" 2>/dev/null)
    if [ -n "$line" ]; then
      rank=$(echo "$line" | awk '{print $2}')
      echo "msrun_launcher: failing worker: rank $rank (stopped answering the scheduler); log: $LOG_DIR/worker_$rank.log" >&2
      last_error "$LOG_DIR/worker_$rank.log"
      named=1
    fi
  fi
  if [ -z "$named" ]; then
    # every worker with an error, the first in full, the others only when their error differs
    local first="" same=0 e
    for f in $(ls "$LOG_DIR"/worker_*.log 2>/dev/null | sort -V); do
      if grep -qE "Traceback|^(error|ERROR): " "$f"; then
        rank=$(basename "$f" .log); rank=${rank#worker_}
        e=$(last_error "$f" 2>&1)
        if [ -z "$first" ] || [ "$e" != "$first" ]; then
          echo "msrun_launcher: failing worker: rank $rank; log: $f" >&2
          [ -n "$e" ] && echo "$e" >&2
          [ -z "$first" ] && first=$e
        else
          same=$((same + 1))
        fi
      fi
    done
    [ "$same" -gt 0 ] && echo "msrun_launcher: $same more worker(s) failed with the same error" >&2
  fi
}

# The worker's first error line: the CLI's one-line "error: ..." / "ERROR: ..." report, else
# the last Python exception line of a traceback (MindSpore's own [LEVEL] lines skipped).
last_error() {
  local e
  e=$(grep -m1 -E "^(error|ERROR): " "$1" 2>/dev/null)
  [ -n "$e" ] || e=$(grep -E "^[A-Za-z_.]*(Error|Exception|Interrupt)\b" "$1" 2>/dev/null | tail -n 1)
  [ -n "$e" ] && echo "  $e" >&2
  return 0
}

# The value of --output_dir in the command's words (empty when it names none).
cmd_output_dir() {
  eval "set -- $1"
  while [ $# -gt 0 ]; do
    case "$1" in
      --output_dir) echo "${2:-}"; return;;
      --output_dir=*) echo "${1#--output_dir=}"; return;;
    esac
    shift
  done
}

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
REPO_ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
export GLOG_v="${GLOG_v:-3}"  # MindSpore logs of msrun and the workers: ERROR and above
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"

MASTER_ADDR="127.0.0.1"
MASTER_PORT="${MASTER_PORT:-8118}"
NODE_RANK=0
LOG_DIR="${LOG_DIR:-}"        # empty: <--output_dir of CMD>/msrun_log, set below
JOIN="${JOIN:-True}"
CLUSTER_TIME_OUT="${CLUSTER_TIME_OUT:-7200}"
# Seconds without a heartbeat after which msrun's scheduler declares a rank lost (MindSpore's
# default is 30). A lost rank or node then ends the job in about this long; heartbeats come
# from a thread of their own, so a slow step does not miss them.
export MS_NODE_TIMEOUT="${MS_NODE_TIMEOUT:-8}"

case $# in
  1|2|6|9) ;;
  0) usage; die "missing the command to run (first argument, quoted)";;
  *) usage; die "expected 1, 2, 6 or 9 arguments, got $#";;
esac

CMD="$1"
[ -n "${CMD// }" ] || { usage; die "the command to run (first argument) is empty"; }
if [ -z "$LOG_DIR" ]; then
  OUT_DIR=$(cmd_output_dir "$CMD")
  LOG_DIR="${OUT_DIR:-output}/msrun_log"
fi

if [ $# -eq 1 ]; then
  NPUS=$(visible_npus)
  if [ "$NPUS" -gt 0 ]; then
    WORKER_NUM=$NPUS
    echo "msrun_launcher: WORKER_NUM=$WORKER_NUM (visible NPUs)"
  else
    WORKER_NUM=1
    echo "msrun_launcher: WORKER_NUM=1 (no NPU visible: CPU host)"
  fi
  LOCAL_WORKER=$WORKER_NUM
else
  WORKER_NUM="$2"
  is_uint "$WORKER_NUM" && [ "$WORKER_NUM" -ge 1 ] || die "WORKER_NUM must be a positive integer, got '$WORKER_NUM'"
  LOCAL_WORKER=$WORKER_NUM
fi

if [ $# -eq 6 ]; then
  MASTER_PORT="$3"; LOG_DIR="$4"; JOIN="$5"; CLUSTER_TIME_OUT="$6"
elif [ $# -eq 9 ]; then
  LOCAL_WORKER="$3"; MASTER_ADDR="$4"; MASTER_PORT="$5"; NODE_RANK="$6"
  LOG_DIR="$7"; JOIN="$8"; CLUSTER_TIME_OUT="$9"
  is_uint "$LOCAL_WORKER" && [ "$LOCAL_WORKER" -ge 1 ] || die "LOCAL_WORKER must be a positive integer, got '$LOCAL_WORKER'"
  [ "$LOCAL_WORKER" -le "$WORKER_NUM" ] || die "LOCAL_WORKER ($LOCAL_WORKER) must be <= WORKER_NUM ($WORKER_NUM)"
  is_uint "$NODE_RANK" || die "NODE_RANK must be a non-negative integer, got '$NODE_RANK'"
  [ $(( WORKER_NUM % LOCAL_WORKER )) -eq 0 ] || die "WORKER_NUM ($WORKER_NUM) must be a multiple"\
    "of LOCAL_WORKER ($LOCAL_WORKER): msrun gives every node the same number of workers"
  [ "$NODE_RANK" -lt $(( WORKER_NUM / LOCAL_WORKER )) ] || die "NODE_RANK ($NODE_RANK) must be"\
    "below the node count WORKER_NUM / LOCAL_WORKER = $(( WORKER_NUM / LOCAL_WORKER ))"
fi
is_uint "$MS_NODE_TIMEOUT" && [ "$MS_NODE_TIMEOUT" -ge 1 ] \
  || die "MS_NODE_TIMEOUT must be a positive number of seconds, got '$MS_NODE_TIMEOUT'"
NODE_NUM=$(( WORKER_NUM / LOCAL_WORKER ))
FIRST_RANK=$(( NODE_RANK * LOCAL_WORKER ))
LAST_RANK=$(( FIRST_RANK + LOCAL_WORKER - 1 ))

is_uint "$MASTER_PORT" && [ "$MASTER_PORT" -ge 1 ] && [ "$MASTER_PORT" -le 65535 ] \
  || die "MASTER_PORT must be in 1..65535, got '$MASTER_PORT'"
is_uint "$CLUSTER_TIME_OUT" || die "CLUSTER_TIME_OUT must be a number of seconds, got '$CLUSTER_TIME_OUT'"
case "$JOIN" in True|False|true|false) ;; *) die "JOIN must be True or False, got '$JOIN'";; esac

if [ "$WORKER_NUM" -eq 1 ] && [ "$LOCAL_WORKER" -eq 1 ]; then
  echo "msrun_launcher: 1 worker: running the command directly (no communication init)"
  echo "Running Command: $CMD"
  eval "$CMD"
  exit $?
fi

command -v msrun >/dev/null 2>&1 || die "msrun not found on PATH: install mindspore (pip install -e .)"

# The scheduler listens on MASTER_ADDR:MASTER_PORT, on node 0 only.
if [ "$NODE_RANK" -eq 0 ]; then
  is_local_address "$MASTER_ADDR" || die "MASTER_ADDR $MASTER_ADDR is not an address of this"\
    "host; node 0 (NODE_RANK 0) runs the scheduler there, so run it on that host"
  port_in_use "$MASTER_PORT" && die "MASTER_PORT $MASTER_PORT is already in use on this host;"\
    "pass another port (6- or 9-argument form, or MASTER_PORT=...)"
fi

mkdir -p "$LOG_DIR" || die "cannot create LOG_DIR '$LOG_DIR'"

MSRUN=(msrun "--worker_num=$WORKER_NUM" "--local_worker_num=$LOCAL_WORKER"
       "--master_port=$MASTER_PORT" "--log_dir=$LOG_DIR" "--join=$JOIN"
       "--cluster_time_out=$CLUSTER_TIME_OUT")
if [ $# -eq 9 ]; then
  MSRUN+=("--master_addr=$MASTER_ADDR" "--node_rank=$NODE_RANK")
fi
# msrun itself, except that only NODE_RANK 0 starts the scheduler (msrun would start one on
# every node that owns MASTER_ADDR: two nodes on one host both would) and the scheduler logs
# which ranks joined: scripts/msrun_node.py
MSRUN_SHOWN="${MSRUN[*]}"   # what the user would type: msrun with these arguments
MSRUN[0]="$SCRIPT_DIR/msrun_node.py"
MSRUN=(python3 "${MSRUN[@]}")

echo "msrun_launcher: node $NODE_RANK of $NODE_NUM runs ranks $FIRST_RANK..$LAST_RANK" \
     "($LOCAL_WORKER of $WORKER_NUM workers); master $MASTER_ADDR:$MASTER_PORT; logs: $LOG_DIR"
echo "Running Command: $MSRUN_SHOWN -- $CMD (msrun through scripts/msrun_node.py)"
echo "Worker logs: $LOG_DIR/worker_<rank>.log"
# msrun takes the program and its arguments as separate words. Its own output is also kept
# in LOG_DIR/msrun_launcher.log: it names the first worker process that died and how.
eval "set -- $CMD"
: > "$LOG_DIR/msrun_launcher.log"
# msrun runs in the background so that the launcher can pass signals on (a shell only runs
# its traps between commands, and `wait` is one). Its output goes through a FIFO to a reader
# that echoes it (msrun's Python traceback only to the log) and reacts to a dead worker.
FIFO="$LOG_DIR/.msrun_launcher.fifo.$$"
rm -f "$FIFO"; mkfifo "$FIFO" || die "cannot create a FIFO in LOG_DIR '$LOG_DIR'"
(
  quiet=""
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$LOG_DIR/msrun_launcher.log"
    case "$line" in "Traceback (most recent call last):"*) quiet=1;; esac
    [ -n "$quiet" ] || printf '%s\n' "$line"
    case "$line" in *"exit with exception. Error code"*) stop_scheduler;; esac
  done
) < "$FIFO" &
READER_PID=$!
# "--": the program's own options are never taken by msrun (it would read a program's
# "--worker" or "--log" as an abbreviation of --worker_num / --log_dir).
# setsid: msrun and its scheduler leave the terminal's process group. Ctrl-C sends SIGINT to
# that whole group; msrun's own SIGINT handler SIGKILLs every worker and exits 0, and the
# scheduler dies before the workers' final save (its collectives need it). So only this
# launcher gets the signal, and forward_stop turns it into a graceful stop of every worker.
# (A background job of a non-interactive shell is no group leader: setsid execs msrun in
# place, and $! stays msrun's pid.)
setsid "${MSRUN[@]}" -- "$@" > "$FIFO" 2>&1 &
MSRUN_PID=$!
WORKERS_FILE="$LOG_DIR/.workers"
: > "$WORKERS_FILE"
record_workers "$MSRUN_PID" &
RECORDER_PID=$!
LOST_FILE="$LOG_DIR/.lost_rank"
rm -f "$LOST_FILE"
WATCHER_PID=""
if [ "$NODE_RANK" -eq 0 ]; then
  watch_scheduler "$MSRUN_PID" &
  WATCHER_PID=$!
fi
trap 'forward_stop TERM' TERM
trap 'forward_stop INT' INT
trap 'forward_stop HUP' HUP    # the terminal closed: msrun, in its own session, would not see it
while :; do
  if [ -n "$STOPPING" ]; then      # stopping: also workers that start after the signal
    signal_workers
    sleep 0.5
    kill -0 "$MSRUN_PID" 2>/dev/null && continue
  fi
  wait "$MSRUN_PID"
  status=$?
  kill -0 "$MSRUN_PID" 2>/dev/null || break   # still running: a trap interrupted the wait
done
if [ "$status" -gt 128 ]; then   # the last wait may have been the interrupted one
  wait "$MSRUN_PID" 2>/dev/null; s2=$?
  [ "$s2" -ne 127 ] && status=$s2
fi
trap - TERM INT HUP
wait "$READER_PID" "$RECORDER_PID" $WATCHER_PID 2>/dev/null
rm -f "$FIFO"
if [ "$status" -ne 0 ] && { [ "$JOIN" = True ] || [ "$JOIN" = true ]; }; then
  report_failure "$status"
  [ -n "$WORKER_CODE" ] && [ "$WORKER_CODE" -gt 0 ] && status=$WORKER_CODE
fi
rm -f "$WORKERS_FILE" "$LOST_FILE"
exit "$status"
