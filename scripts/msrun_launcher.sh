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
    echo "msrun_launcher: a worker failed; stopping the scheduler (pid $pid) so the job ends now" >&2
    kill -TERM "$pid" 2>/dev/null || true
    # a scheduler that ignores SIGTERM (a user script's own handler) is killed 2 s later
    ( sleep 2; kill -KILL "$pid" 2>/dev/null ) &
  done
}

# SIGTERM/SIGINT to the launcher: pass SIGTERM to every worker (children of msrun with
# MS_ROLE=MS_WORKER; each leads its own process group) so each finishes its step and saves.
forward_stop() {
  local sig=$1 child
  echo "msrun_launcher: received SIG$sig; asking every worker to finish its step, save and exit" >&2
  for child in $(msrun_children MS_WORKER); do
    kill -TERM -- "-$child" 2>/dev/null || kill -TERM "$child" 2>/dev/null || true
  done
}

# After a failed job: name the worker that failed first (msrun logs "Worker process PID exit
# with exception. Error code: C"; the PID appears in that worker's log lines), how it ended
# (a negative code is the signal that killed it), and its first error line; else the worker the
# scheduler saw time out first; else every worker whose log holds a Python traceback.
# Sets WORKER_CODE to the failing worker's exit status (128+N for signal N) when known.
WORKER_CODE=""
report_failure() {
  local status=$1 out="$LOG_DIR/msrun_launcher.log" line pid code f rank how named=""
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
    if [ -n "$rank" ]; then
      f="$LOG_DIR/worker_$rank.log"
      echo "msrun_launcher: failing worker: rank $rank (pid $pid, $how); log: $f" >&2
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
fi

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

# The scheduler listens on MASTER_PORT on the master node only.
if [ "$NODE_RANK" -eq 0 ] && port_in_use "$MASTER_PORT"; then
  die "MASTER_PORT $MASTER_PORT is already in use on this host; pass another port (6- or 9-argument form, or MASTER_PORT=...)"
fi

mkdir -p "$LOG_DIR" || die "cannot create LOG_DIR '$LOG_DIR'"

MSRUN=(msrun "--worker_num=$WORKER_NUM" "--local_worker_num=$LOCAL_WORKER"
       "--master_port=$MASTER_PORT" "--log_dir=$LOG_DIR" "--join=$JOIN"
       "--cluster_time_out=$CLUSTER_TIME_OUT")
if [ $# -eq 9 ]; then
  MSRUN+=("--master_addr=$MASTER_ADDR" "--node_rank=$NODE_RANK")
fi

echo "Running Command: ${MSRUN[*]} -- $CMD"
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
trap 'forward_stop TERM' TERM
trap 'forward_stop INT' INT
trap 'forward_stop HUP' HUP    # the terminal closed: msrun, in its own session, would not see it
while :; do
  wait "$MSRUN_PID"
  status=$?
  kill -0 "$MSRUN_PID" 2>/dev/null || break   # still running: a trap interrupted the wait
done
if [ "$status" -gt 128 ]; then   # the last wait may have been the interrupted one
  wait "$MSRUN_PID" 2>/dev/null; s2=$?
  [ "$s2" -ne 127 ] && status=$s2
fi
trap - TERM INT HUP
wait "$READER_PID" "$RECORDER_PID" 2>/dev/null
rm -f "$FIFO"
if [ "$status" -ne 0 ] && { [ "$JOIN" = True ] || [ "$JOIN" = true ]; }; then
  report_failure "$status"
  [ -n "$WORKER_CODE" ] && [ "$WORKER_CODE" -gt 0 ] && status=$WORKER_CODE
fi
rm -f "$WORKERS_FILE"
exit "$status"
