# Shared by benches/rooms/*.sh (sourced): the binary, a server on CPU 0 with
# benches/rooms/rooms.toml, its metrics, RSS and CPU, the header of a result file.
#
# POLLBOX_BIN=path: that binary (POLLBOX_REV=label names it); else
# target/release/pollbox, built first unless BENCH_NO_BUILD=1. The binary is
# copied, so a build in the tree during the run changes nothing. Each script writes
# benches/rooms/results/<date>-<part><ROOMS_TAG>.txt (ROOMS_TAG=-limit-100: a variant's
# file beside the default run's).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$(pwd)
CFG=$ROOT/benches/rooms/rooms.toml
RES=$ROOT/benches/rooms/results
mkdir -p "$RES"
D=$(mktemp -d /tmp/rooms-bench.XXXXXX)
BGS=""   # the generators started with Lbg, stopped on exit
cleanup() {
    for p in $BGS; do kill -TERM "$p" 2>/dev/null || true; done
    stop_server
    # ROOMS_KEEP=1: leave the raw files (the generators' reports, callgrind's outputs) in $D.
    if [ "${ROOMS_KEEP:-0}" = 1 ]; then echo "# raw files kept in $D" >&2; else rm -rf "$D"; fi
}
trap cleanup EXIT
if [ -n "${POLLBOX_BIN:-}" ]; then
    cp "$POLLBOX_BIN" "$D/pollbox"
    REV=${POLLBOX_REV:-"binary $POLLBOX_BIN"}
else
    if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
        cargo build --release -q -p pollbox
    fi
    cp target/release/pollbox "$D/pollbox"
    REV="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes')"
fi
B=$D/pollbox
# 10,000 streams on each side (100,000 presence members for presence-read.sh: root,
# where the container lets it, may raise the hard limit).
ulimit -Hn 250000 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
PORT=0
SRV=""

# What else runs: load average, and the compilers and other heavy processes.
machine_state() {
    local busy
    busy=$(top -b -n 2 -d 1 -w 200 | awk '/^top -/ {n++} n == 2 && $1 ~ /^[0-9]+$/ && $9 > 5 {printf "%s %s%%, ", $12, $9}' | sed 's/, $//')
    echo "# load average $(cut -d' ' -f1-3 /proc/loadavg); rustc processes running: $(pgrep -c -x rustc || true); over 5 % of a CPU just now: ${busy:-none}"
}

header() {
    echo "# $1"
    echo "# $(date -u +%FT%TZ) on $(hostname): $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(uname -r)"
    echo "# pollbox $REV (sha256 $(sha256sum "$B" | cut -c1-12)), config benches/rooms/rooms.toml, one worker on CPU 0; pollbox load (and clients) on CPU 1"
    machine_state
}

# start_server [extra args]: a fresh server on CPU 0, one worker.
start_server() {
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    taskset -c 0 "$B" serve --config "$CFG" --listen "127.0.0.1:$PORT" --workers 1 "$@" \
        >"$D/serve-$PORT.log" 2>&1 &
    SRV=$!
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "server did not start:" >&2
    cat "$D/serve-$PORT.log" >&2
    return 1
}

stop_server() {
    if [ -n "${SRV:-}" ]; then
        kill -INT "$SRV" 2>/dev/null || true
        wait "$SRV" 2>/dev/null || true
        SRV=""
    fi
}

URL() { echo "http://127.0.0.1:$PORT"; }
# metric NAME: a sample's value (the first line whose name and labels are NAME).
# (awk reads to the end: an early exit would fail curl, and the pipeline, with SIGPIPE.)
metric() { curl -s "$(URL)/metrics" | awk -v m="$1" '$1==m && !seen {print $2; seen=1}'; }
accounted() { curl -s "$(URL)/metrics" | awk '/^pollbox_accounted_bytes/ {s+=$2} END {printf "%d\n", s}'; }
rss() { awk '/VmRSS/ {print $2*1024}' "/proc/$SRV/status"; }
# utime + stime of the server, in clock ticks (/proc/PID/stat fields 14 and 15).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SRV/stat"; }
TICK=$(getconf CLK_TCK)
# wait_metric NAME VALUE SECONDS: until the metric reaches VALUE.
wait_metric() {
    local v
    for _ in $(seq $(($3 * 10))); do
        v=$(metric "$1")
        if [ -n "$v" ] && awk -v a="$v" -v b="$2" 'BEGIN {exit !(a >= b)}'; then return 0; fi
        sleep 0.1
    done
    echo "$1 stayed at ${v:-nothing}, short of $2" >&2
    return 1
}
# L ARGS...: pollbox load on CPU 1 against the server.
L() { taskset -c 1 "$B" load --url "$(URL)" "$@"; }
# Lbg OUTFILE ARGS...: the same in the background, its pid in BG (the process
# itself, not a subshell, so that it can be stopped: kill -TERM "$BG").
Lbg() {
    local out=$1
    shift
    taskset -c 1 "$B" load --url "$(URL)" "$@" >"$out" 2>&1 &
    BG=$!
    BGS="$BGS $BG"
}
# log_to FILE: everything from here on to FILE and the terminal (in this shell, so
# that the EXIT trap still stops what the script started).
log_to() { exec > >(tee "$1") 2>&1; }

# ROOMS_REPS rounds of `run_one KIND REP` for each KIND given, in order: each
# run's JSON line printed and kept in $D/runs.jsonl.
rounds() {
    local rep kind
    for rep in $(seq "$REPS"); do
        for kind in "$@"; do
            run_one "$kind" "$rep" >"$D/last"
            cat "$D/last"
            cat "$D/last" >>"$D/runs.jsonl"
        done
    done
}
