#!/usr/bin/env bash
# Box expiry through the release binary: create BOXES boxes with
# `ttl_s` set, let them all expire, and show
# - with `pollbox memcheck` (before, full, expired, and 10 s later once
#   jemalloc's dirty-page decay has run) that the memory goes back: the box
#   count, the accounted `boxes` bytes and jemalloc's allocated bytes fall back;
# - with `pollbox_tick_duration_seconds` what each tick's work (arena reset,
#   timers, one bounded expiry step) took while the boxes expired: the ticks of
#   that window, by histogram bucket.
#
#   benches/expiry/run.sh [BOXES]     # default 100000
#
# Environment: TTL_S (10: long enough to create the boxes before the first
# ones expire), TTL_WORKERS (2), TTL_NO_BUILD=1 to use target/release/pollbox
# as it is. Needs python3 (it sends the boxes, 1,000 per NDJSON request, over
# one keep-alive connection) and curl.
set -euo pipefail

boxes="${1:-100000}"
ttl="${TTL_S:-10}"
workers="${TTL_WORKERS:-2}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [[ -z "${TTL_NO_BUILD:-}" ]]; then
    cargo build --release -q -p pollbox >&2
fi
bin="$root/target/release/pollbox"
work="$(mktemp -d "${TMPDIR:-/tmp}/pollbox-ttl.XXXXXX")"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/ttl.toml" <<TOML
[server]
listen = "127.0.0.1:0"
workers = $workers
[boxes]
ttl_s = $ttl
TOML
"$bin" serve --config "$work/ttl.toml" 2> "$work/server.log" &
server_pid=$!
for _ in $(seq 100); do
    grep -q "http://" "$work/server.log" 2>/dev/null && break
    sleep 0.1
done
url="$(grep -o 'http://[0-9.:]*' "$work/server.log" | head -1)"
metrics() { curl -s "$url/metrics"; }
show() {
    echo "== $1"
    "$bin" memcheck --url "$url"
    metrics | grep -E '^(pollbox_boxes|pollbox_boxes_expired_total|pollbox_accounted_bytes\{part="boxes"\}|pollbox_jemalloc_allocated_bytes|process_resident_memory_bytes) '
    echo
}
ticks() { metrics | grep '^pollbox_tick_duration_seconds_bucket'; }

echo "pollbox $(git rev-parse --short HEAD) ttl_s=$ttl workers=$workers boxes=$boxes ($(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
echo
sleep 1 # the workers publish their counters at each tick
show "before"

python3 - "$url" "$boxes" <<'PY'
import http.client, sys
url, n = sys.argv[1], int(sys.argv[2])
host, port = url.removeprefix("http://").split(":")
c = http.client.HTTPConnection(host, int(port))
for start in range(0, n, 1000):
    body = "".join(
        '{"key":"round-%d","value":%d,"player":"p-%d"}\n' % (k, k, k % 100)
        for k in range(start, min(n, start + 1000))
    ).encode()
    c.request("POST", "/v1/ingest", body, {"Content-Type": "application/x-ndjson"})
    r = c.getresponse()
    text = r.read().decode()
    assert r.status == 200 and '"rejected":0' in text, text
PY
created="$(date +%s.%N)"
ticks > "$work/ticks.before"
show "$boxes boxes created"

while [[ "$(metrics | awk '$1 == "pollbox_boxes" {print $2}')" != "0" ]]; do
    sleep 0.1
done
gone="$(date +%s.%N)"
ticks > "$work/ticks.after"
show "all expired, $(echo "$gone - $created" | bc) s after the last box was created"

echo "== ticks while the boxes expired (pollbox_tick_duration_seconds, both workers)"
paste "$work/ticks.before" "$work/ticks.after" | awk '
    { split($1, a, "\""); le = a[2]; n = $4 - $2; d = n - prev; prev = n;
      printf "  le %-9s %7d\n", le, d }'
metrics | grep -E '^pollbox_epoch_(work_max_seconds|overruns_total) '
echo

sleep 10
show "10 s later (jemalloc has purged the dirty pages: dirty_decay_ms 5000)"
