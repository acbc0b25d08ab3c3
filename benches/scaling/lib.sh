# shellcheck shell=bash
# Helpers shared by benches/scaling/run.sh and seed.sh (sourced, not run).

# The embedded config with `pin_workers = true`, written to $1; with
# SCALE_PLACEMENT=hash also `place_by_load = false` (connections stay where the
# kernel's SO_REUSEPORT hash puts them), for side-by-side runs of one build.
pinned_config() {
    sed 's/^pin_workers = false/pin_workers = true/' "$ROOT/config/pollbox.toml" >"$1"
    grep -q '^pin_workers = true' "$1" || { echo "scaling: could not turn pin_workers on" >&2; exit 1; }
    if [[ ${SCALE_PLACEMENT:-load} == hash ]]; then
        sed -i 's/^place_by_load = true/place_by_load = false/' "$1"
        grep -q '^place_by_load = false' "$1" || { echo "scaling: could not turn place_by_load off" >&2; exit 1; }
    fi
}

# The server's set-up, for both scripts: BIN (the binary $2, else a release
# build, skipped when $3 is set), HZ (clock ticks per second), CFG (the pinned
# config, written into the directory $1), and a raised open-files limit.
prepare_server() {
    local prebuilt=${2:-}
    if [[ -z $prebuilt ]]; then
        [[ -n ${3:-} ]] || (cd "$ROOT" && cargo build --release -q -p pollbox)
        prebuilt=$ROOT/target/release/pollbox
    fi
    # shellcheck disable=SC2034 # used by the scripts that source this
    {
        BIN=$prebuilt
        HZ=$(getconf CLK_TCK)
        CFG=$1/pollbox.toml
    }
    pinned_config "$CFG"
    ulimit -n 65536 2>/dev/null || true
}

# Wait (up to 5 s) until something accepts on 127.0.0.1:$1.
wait_ready() {
    local port=$1
    for _ in $(seq 100); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "scaling: server on $port did not start" >&2
    return 1
}

# Start the server on cores $1 (a taskset list), port $2, $3 workers, its
# output to $4, and wait until it accepts; its pid is left in SRV.
start_server() {
    taskset -c "$1" "$BIN" serve --config "$CFG" --listen "127.0.0.1:$2" --workers "$3" >"$4" 2>&1 &
    SRV=$!
    wait_ready "$2"
}

# Stop the server start_server started (SIGINT: a clean shutdown).
stop_server() {
    kill -INT "$SRV"
    wait "$SRV" || true
}

# utime + stime of process $1, all threads, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The first two header lines: script, date and commit; the machine.
run_header() {
    echo "# benches/scaling/$1: $(date -u +%FT%TZ), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "# machine: $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), kernel $(uname -r)"
}
