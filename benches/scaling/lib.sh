# shellcheck shell=bash
# Helpers shared by benches/scaling/run.sh and seed.sh (sourced, not run).

# The embedded config with `pin_workers = true`, written to $1.
pinned_config() {
    sed 's/^pin_workers = false/pin_workers = true/' "$ROOT/config/pollbox.toml" >"$1"
    grep -q '^pin_workers = true' "$1" || { echo "scaling: could not turn pin_workers on" >&2; exit 1; }
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

# utime + stime of process $1, all threads, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The first two header lines: script, date and commit; the machine.
run_header() {
    echo "# benches/scaling/$1: $(date -u +%FT%TZ), commit $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo "# machine: $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), kernel $(uname -r)"
}
