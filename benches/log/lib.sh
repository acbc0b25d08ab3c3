# shellcheck shell=bash disable=SC2034 # sets variables for the scripts that source it
# Shared by benches/log/*.sh (sourced): the builds, a broker, pollbox nodes,
# CPU readings, the results file's header, and cleanup of everything started.
#
# Knobs every script reads:
#   LOG_BOOTSTRAP, LOG_BROKER_PID  use a running broker (run.sh passes its own);
#                                  else a fresh one is started and stopped here
#   LOG_NODE_CPU (0)   where pollbox nodes and the bare clients run
#   LOG_LOAD_CPU (1)   where the broker, `pollbox load` and this script run
#   LOG_CLIENT         extra `[log.client]` lines for pollbox nodes and the same
#                      properties for the bare consumer, e.g.
#                      LOG_CLIENT='"fetch.queue.backoff.ms" = "10"'
#   LOG_CONSUMERS      `log.consumers` of pollbox nodes (unset: the default)
#   LOG_RESULTS        results folder (benches/log/results)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
NODE_CPU=${LOG_NODE_CPU:-0}
LOAD_CPU=${LOG_LOAD_CPU:-1}
RESULTS=${LOG_RESULTS:-$ROOT/benches/log/results}
WORK=$(mktemp -d /tmp/pollbox-logbench.XXXXXX)
STARTED_PIDS=()
OWN_BROKER_DIR=""
mkdir -p "$RESULTS"

# Build, then run copies: others' builds in this tree may replace
# target/release while a run goes on. LOG_BIN_DIR (set by run.sh): use those.
build() {
  if [[ -n "${LOG_BIN_DIR:-}" ]]; then
      POLLBOX=$LOG_BIN_DIR/pollbox LOGBENCH=$LOG_BIN_DIR/logbench BUILD_DESC=$LOG_BUILD_DESC
    return
  fi
  cargo build --release -q -p pollbox
  cargo build --release -q -p pollbox-benches --example logbench
  BUILD_DESC="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates config Cargo.lock 2>/dev/null \
    || echo ' + uncommitted changes in crates/, config/ or Cargo.lock')"
  mkdir -p "$WORK/bin"
  cp target/release/pollbox target/release/examples/logbench "$WORK/bin/"
  POLLBOX=$WORK/bin/pollbox LOGBENCH=$WORK/bin/logbench
}

# Wait (LOG_QUIET_WAIT s at most, 600) while a compiler runs on this shared
# machine; says how long it waited.
quiet() {
  local t0=$SECONDS
  while pgrep -x rustc >/dev/null && ((SECONDS - t0 < ${LOG_QUIET_WAIT:-600})); do sleep 5; done
  QUIET_DESC="waited $((SECONDS - t0)) s for running compilers to finish"
  if pgrep -x rustc >/dev/null; then QUIET_DESC+=", then went on with one running"; fi
}

# shellcheck source=../lib/procs.sh
. "$ROOT/benches/lib/procs.sh"

MAIN_PID=$BASHPID
cleanup() {
  # Only the script itself cleans up, not a subshell that inherited the trap.
  [[ $BASHPID == "$MAIN_PID" ]] || return 0
  stop_pids "${STARTED_PIDS[@]+"${STARTED_PIDS[@]}"}"
  if [[ -n "$OWN_BROKER_DIR" ]]; then scripts/kafka/stop.sh "$OWN_BROKER_DIR" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# This script itself (and whatever it starts unpinned) on the load core.
taskset -cp "$LOAD_CPU" $$ >/dev/null

# A broker: the one named by LOG_BOOTSTRAP/LOG_BROKER_PID, else a new one
# (4 partitions by default), its every thread pinned to LOAD_CPU.
broker_up() {
  if [[ -n "${LOG_BOOTSTRAP:-}" ]]; then
    BOOTSTRAP=$LOG_BOOTSTRAP BROKER_PID=$LOG_BROKER_PID
  else
    scripts/kafka/start.sh --partitions 4 --watch-pid $$ >"$WORK/broker.env" 2>"$WORK/broker.err" \
      || { cat "$WORK/broker.err" >&2; exit 1; }
    # shellcheck disable=SC1091
    . "$WORK/broker.env"
    BROKER_PID=$PID OWN_BROKER_DIR=$DIR
  fi
  taskset -a -cp "$LOAD_CPU" "$BROKER_PID" >/dev/null
}

topic_create() { # NAME [PARTITIONS]
  scripts/kafka/topic.sh "$BOOTSTRAP" create "$1" "${2:-4}" >/dev/null 2>&1
}

# utime + stime of a process in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
now() { date +%s.%N; }

# logbench's `--client k=v,...` for the TOML lines CLIENT ("" when empty).
client_arg() {
  [[ -n "${1:-}" ]] || return 0
  python3 - "$1" <<'PY'
import sys, tomllib
print("--client " + ",".join(f"{k}={v}" for k, v in tomllib.loads(sys.argv[1]).items()))
PY
}

# node_up NAME PORT [TOPIC]: a pollbox node with one worker on NODE_CPU; with
# TOPIC, a node of that log. Sets NODE_PID and NODE_T0 (its start).
node_up() {
  local name=$1 port=$2 topic=${3:-}
  {
    echo "[server]"
    echo "listen = \"127.0.0.1:$port\""
    echo "workers = 1"
    if [[ -n "$topic" ]]; then
      echo "[log]"
      echo "brokers = \"$BOOTSTRAP\""
      echo "topic = \"$topic\""
      echo "allow_unsafe_topic = true   # one broker"
      if [[ -n "${LOG_CONSUMERS:-}" ]]; then echo "consumers = $LOG_CONSUMERS"; fi
      if [[ -n "${LOG_CLIENT:-}" ]]; then echo "[log.client]"; echo "$LOG_CLIENT"; fi
    fi
  } >"$WORK/$name.toml"
  NODE_T0=$(now)
  taskset -c "$NODE_CPU" "$POLLBOX" serve --config "$WORK/$name.toml" >"$WORK/$name.log" 2>&1 &
  NODE_PID=$!
  STARTED_PIDS+=("$NODE_PID")
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && return 0; sleep 0.02; done
  echo "node $name did not come up:" >&2; cat "$WORK/$name.log" >&2; exit 1
}

node_down() { # PID
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

wait_ready() { # PORT [TIMEOUT_S]
  local deadline=$((SECONDS + ${2:-600}))
  until curl -sf "http://127.0.0.1:$1/readyz" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "not ready after ${2:-600}s" >&2; return 1; }
    sleep 0.02
  done
}

# header OUT COMMAND: the results file's first lines.
header() {
  local out=$1; shift
  {
    echo "# command: $*"
    echo "# build: $BUILD_DESC"
    echo "# date: $(date -u +%FT%TZ)"
    echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(uname -r)"
    echo "# load average at start: $(cut -d" " -f1-3 /proc/loadavg) (${QUIET_DESC:-no wait for quiet})"
    echo "# pinning: pollbox nodes and bare clients on CPU $NODE_CPU; broker (all threads), pollbox load, this script on CPU $LOAD_CPU"
    echo "# broker: $BOOTSTRAP (pid $BROKER_PID; scripts/kafka, Kafka $(bash -c '. scripts/kafka/lib.sh && kafka_version' 2>/dev/null))"
    echo "# log.client: ${LOG_CLIENT:-none (as pollbox sets its clients)}"
  } | tee "$out"
}
