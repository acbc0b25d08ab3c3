# shellcheck shell=bash disable=SC2034 # sets variables for the scripts that source it
# Shared by benches/wal/*.sh (sourced): the build, the sync probe, pollbox nodes
# with and without the write-ahead file, CPU readings, the results file's header,
# and cleanup of everything started.
#
# Knobs every script reads:
#   WAL_SERVER_CPU (0)  where servers (pollbox, redis-server, nats-server) run
#   WAL_LOAD_CPU (1)    where load generators and this script run
#   WAL_DATA (/tmp)     where the data folders go (the disk measured)
#   WAL_RESULTS         results folder (benches/wal/results)
#   WAL_TAG             appended to the results file's name

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
SERVER_CPU=${WAL_SERVER_CPU:-0}
LOAD_CPU=${WAL_LOAD_CPU:-1}
RESULTS=${WAL_RESULTS:-$ROOT/benches/wal/results}
WORK=$(mktemp -d "${WAL_DATA:-/tmp}/pollbox-walbench.XXXXXX")
STARTED_PIDS=()
mkdir -p "$RESULTS" "$WORK/bin"
HZ=$(getconf CLK_TCK)

# shellcheck source=../lib/procs.sh
. "$ROOT/benches/lib/procs.sh"

MAIN_PID=$BASHPID
cleanup() {
  # Only the script itself cleans up, not a subshell that inherited the trap.
  [[ $BASHPID == "$MAIN_PID" ]] || return 0
  stop_pids "${STARTED_PIDS[@]+"${STARTED_PIDS[@]}"}"
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# This script itself (and whatever it starts unpinned) on the load core.
taskset -cp "$LOAD_CPU" $$ >/dev/null

# Build once, then run a copy (others' builds may replace target/release during a
# run); the sync probe beside it.
build() {
  local target=${CARGO_TARGET_DIR:-$ROOT/target}
  cargo build --release -q -p pollbox
  cp "$target/release/pollbox" "$WORK/bin/"
  POLLBOX=$WORK/bin/pollbox
  cc -O2 -o "$WORK/bin/syncprobe" "$ROOT/benches/wal/syncprobe.c"
  SYNCPROBE=$WORK/bin/syncprobe
  BUILD_DESC="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates config Cargo.lock 2>/dev/null \
    || echo ' + uncommitted changes in crates/, config/ or Cargo.lock')"
}

# utime + stime of a process in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# "NAME TICKS" for each thread of a process (its name as the kernel keeps it, 15 bytes).
thread_ticks() {
  local t
  for t in /proc/"$1"/task/*; do
    echo "$(tr ' ' _ <"$t/comm") $(awk '{print $14 + $15}' "$t/stat" 2>/dev/null || echo 0)"
  done
}
now() { date +%s.%N; }

# What else runs: compilers and the busiest processes (the machine is shared).
contention() {
  echo "# uptime: $(uptime)"
  echo "# compilers running: $(ps -eo comm= | grep -cE '^(rustc|cc1|cc1plus|compile|ld|cargo)$' || true)"
  ps -eo pcpu,comm --sort=-pcpu | sed -n '2,5p' | awk '{printf "#   %s%% %s\n", $1, $2}'
}

# node_up NAME PORT MODE [TOML]: a pollbox node with one worker on SERVER_CPU,
# its snapshot in $WORK/NAME (interval WAL_SNAPSHOT_S, 10 s); MODE wal adds the
# write-ahead file in $WORK/NAME/wal. TOML: more lines for the file (after
# [snapshot]'s keys; may open tables). Keeps the data folder (a restart finds it).
# Sets NODE_PID and NODE_T0 (its start, from `now`).
node_up() {
  local name=$1 port=$2 mode=$3 extra=${4:-}
  mkdir -p "$WORK/$name"
  {
    echo "[server]"
    echo "listen = \"127.0.0.1:$port\""
    echo "workers = 1"
    echo "[boxes]"
    echo "max_boxes = ${WAL_MAX_BOXES:-2000000}"
    echo "[snapshot]"
    echo "path = \"$WORK/$name/boxes.snap\""
    echo "interval_s = ${WAL_SNAPSHOT_S:-10}"
    if [[ "$mode" == wal ]]; then
      echo "[wal]"
      echo "path = \"$WORK/$name/wal\""
    fi
    [[ -z "$extra" ]] || echo "$extra"
  } >"$WORK/$name.toml"
  NODE_T0=$(now)
  taskset -c "$SERVER_CPU" "$POLLBOX" serve --config "$WORK/$name.toml" >>"$WORK/$name.log" 2>&1 &
  NODE_PID=$!
  STARTED_PIDS+=("$NODE_PID")
}


wait_ready() { # PORT NAME [TIMEOUT_S]
  local deadline=$((SECONDS + ${3:-600}))
  until ready "$1"; do
    if ((SECONDS >= deadline)); then
      echo "node $2 not ready after ${3:-600}s:" >&2; cat "$WORK/$2.log" >&2; return 1
    fi
    sleep 0.01
  done
}

node_down() { # PID [SIGNAL]
  kill "-${2:-TERM}" "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# header OUT COMMAND: the results file's first lines.
header() {
  local out=$1; shift
  {
    echo "# command: $*"
    echo "# build: ${BUILD_DESC:-none}"
    echo "# date: $(date -u +%FT%TZ)"
    echo "# machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(uname -r)"
    echo "# disk: $(df -hT "$WORK" | tail -1)"
    echo "# pinning: servers on CPU $SERVER_CPU; load generators and this script on CPU $LOAD_CPU"
    contention
  } | tee "$out"
}
