#!/usr/bin/env bash
# Soak test: a release server pinned to one core under steady mixed load from
# the bundled generator pinned to another, watched for memory growth and late
# epochs.
#
#   benches/soak/run.sh [SECONDS]      # default 600
#
# Steps:
# 1. build `pollbox` (release);
# 2. start `pollbox serve --workers 1` pinned to core $SOAK_SERVER_CPU (0);
# 3. measure capacity with a 5 s closed-loop run of the same mix (skipped when
#    SOAK_RATE is set), then drive open-loop at half of it (SOAK_RATE to
#    override), `--mix poll:80,ingest:15,batch:5`, from core $SOAK_LOAD_CPU (1);
# 4. every 60 s (every 10 s when SECONDS < 120) print a row: elapsed, process
#    RSS (VmRSS), jemalloc allocated, pollbox's accounted total (sum of
#    pollbox_accounted_bytes), the gap between the two, epoch overruns since
#    the soak load started, and how long the server's threads waited for a CPU
#    since the previous row (schedstat run-queue delay: a neighbour taking the
#    server's core shows here);
# 5. at the end print the RSS growth from the baseline row (the row at 60 s, or
#    the first row for runs under 120 s) to the last row, and exit 1 if it is
#    2% or more or if any epoch overran, or if the load generator failed.
#
# Environment: SOAK_RATE (req/s), SOAK_KEYS (10000), SOAK_CONNECTIONS (64),
# SOAK_SERVER_CPU (0), SOAK_LOAD_CPU (1), SOAK_PORT (a free one), SOAK_NO_BUILD=1
# to use target/release/pollbox as it is.
set -euo pipefail

seconds="${1:-600}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 20)); then
    echo "usage: $0 [SECONDS >= 20]" >&2
    exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

server_cpu="${SOAK_SERVER_CPU:-0}"
load_cpu="${SOAK_LOAD_CPU:-1}"
keys="${SOAK_KEYS:-10000}"
connections="${SOAK_CONNECTIONS:-64}"
mix="poll:80,ingest:15,batch:5"
if ((seconds < 120)); then interval=10; else interval=60; fi

if [[ -z "${SOAK_NO_BUILD:-}" ]]; then
    cargo build --release -p pollbox >&2
fi
bin="$root/target/release/pollbox"

port="${SOAK_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
url="http://127.0.0.1:$port"
work="$(mktemp -d "${TMPDIR:-/tmp}/pollbox-soak.XXXXXX")"

server_pid=""
load_pid=""
cleanup() {
    [[ -n "$load_pid" ]] && kill "$load_pid" 2>/dev/null || true
    if [[ -n "$server_pid" ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

taskset -c "$server_cpu" "$bin" serve --listen "127.0.0.1:$port" --workers 1 2>"$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
    curl -fsS "$url/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "$url/readyz" >/dev/null || {
    echo "server did not become ready:" >&2
    cat "$work/server.log" >&2
    exit 1
}

load() {
    taskset -c "$load_cpu" "$bin" load --url "$url" --mix "$mix" --keys "$keys" \
        --connections "$connections" --quiet "$@"
}

if [[ -n "${SOAK_RATE:-}" ]]; then
    rate="$SOAK_RATE"
    load --preseed --duration 1s >/dev/null
    echo "rate: $rate req/s (SOAK_RATE)"
else
    load --preseed --duration 5s --json "$work/capacity.json" >"$work/capacity.txt"
    capacity="$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["achieved_rate"]))' \
        "$work/capacity.json")"
    if ((capacity <= 0)); then
        echo "could not read the capacity from the load report:" >&2
        cat "$work/capacity.txt" >&2
        exit 1
    fi
    rate=$((capacity / 2))
    echo "capacity: $capacity req/s closed-loop over 5 s; soak rate: $rate req/s (half)"
fi

metric_sum() { # name [label filter]: sum of the samples of a metric
    awk -v name="$1" -v filter="${2:-}" '
        $1 ~ "^" name "([{]|$)" && index($1, filter) { s += $2 }
        END { printf "%.0f", s }' "$work/metrics.txt"
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
# Nanoseconds the server's threads have spent runnable but waiting for a CPU
# (second field of /proc/PID/task/TID/schedstat): on a shared machine, what
# tells a late epoch caused by a neighbour from one caused by the server.
runq_ns() {
    cat /proc/"$server_pid"/task/*/schedstat 2>/dev/null | awk '{ s += $2 } END { printf "%.0f", s }'
}

# Overruns while measuring capacity (a saturated worker) are not the soak's.
curl -fsS "$url/metrics" >"$work/metrics.txt"
overruns_before=$(metric_sum pollbox_epoch_overruns_total)
if ((overruns_before > 0)); then
    echo "epoch overruns before the soak (capacity run, pre-seeding): $overruns_before; counted from here"
fi

load --rate "$rate" --duration "${seconds}s" --max-error-rate 0 --json "$work/load.json" \
    >"$work/load.txt" 2>&1 &
load_pid=$!
start=$(date +%s)
runq_prev=$(runq_ns)

printf '%8s %10s %14s %14s %10s %9s %13s\n' elapsed_s rss_mib jemalloc_mib accounted_mib gap_pct overruns runq_wait_ms
base_rss=""
last_rss=""
overruns=0
next=$interval
while :; do
    now=$(date +%s)
    if ((now - start < next)); then
        kill -0 "$load_pid" 2>/dev/null || break
        sleep 1
        continue
    fi
    elapsed=$((now - start))
    rss_kib=$(awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status")
    rss=$((rss_kib * 1024))
    curl -fsS "$url/metrics" >"$work/metrics.txt"
    allocated=$(metric_sum pollbox_jemalloc_allocated_bytes)
    accounted=$(metric_sum pollbox_accounted_bytes)
    overruns=$(($(metric_sum pollbox_epoch_overruns_total) - overruns_before))
    gap=$(awk -v a="$allocated" -v b="$accounted" 'BEGIN { printf "%.1f", b ? (a - b) * 100 / b : 0 }')
    runq=$(runq_ns)
    wait_ms=$(((runq - runq_prev) / 1000000))
    runq_prev=$runq
    printf '%8d %10s %14s %14s %10s %9d %13d\n' "$elapsed" "$(mib "$rss")" "$(mib "$allocated")" \
        "$(mib "$accounted")" "$gap" "$overruns" "$wait_ms"
    last_rss=$rss
    # Baseline: the first row at or after one minute (the first row for
    # short runs), once start-up, pre-seeding and warm-up are behind.
    if [[ -z "$base_rss" ]] && { ((seconds < 120)) || ((elapsed >= 60)); }; then
        base_rss=$rss
    fi
    next=$((next + interval))
    ((next <= seconds)) || break
done

load_status=0
wait "$load_pid" || load_status=$?
load_pid=""
echo
echo "load generator (exit $load_status):"
sed 's/^/  /' "$work/load.txt"

if [[ -z "$base_rss" || -z "$last_rss" ]]; then
    echo "no samples taken" >&2
    exit 1
fi
growth=$(awk -v a="$base_rss" -v b="$last_rss" 'BEGIN { printf "%.2f", (b - a) * 100 / a }')
echo
echo "RSS growth from the baseline row to the last: ${growth}% ($(mib "$base_rss") -> $(mib "$last_rss") MiB); epoch overruns: $overruns"
echo "(server log, load report and JSON in $work)"
status=0
if awk -v g="$growth" 'BEGIN { exit !(g >= 2) }'; then
    echo "FAIL: RSS grew by 2% or more"
    status=1
fi
if ((overruns > 0)); then
    echo "FAIL: $overruns epoch overrun(s)"
    status=1
fi
if ((load_status != 0)); then
    echo "FAIL: the load generator exited with $load_status"
    status=1
fi
((status == 0)) && echo "PASS"
exit $status
