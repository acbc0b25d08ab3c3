#!/usr/bin/env bash
# pollbox's own /metrics exposition against prometheus-client 0.24's text
# encoder on the same content, and what prometheus-client's shared atomics
# would cost the workers (docs/metrics-choice.md).
#
#   bash benches/scrape/vs-prometheus-client.sh [PORT] [REFERENCE_OUT]
#
# 1. A real scrape: the release binary, two workers, 3 s of
#    `pollbox load --mix poll:50,ingest:50`, then GET /metrics, saved to
#    REFERENCE_OUT (default /tmp/vs-pc-reference.txt): the shape to match.
# 2. The vs_prometheus_client example (benches/scrape/vs_prometheus_client.rs):
#    the same server in its process under the same load, pollbox's
#    metrics::render beside a prometheus-client Registry built from that
#    render (same families, label sets, series, buckets, values), timed
#    natively (median µs per scrape, bytes, allocations) ...
# 3. ... and under callgrind (instructions per scrape, each side toggled on
#    inside its own loop only); and benches/scrape/callgrind.sh on the
#    release binary as a cross-check of pollbox's figure.
# 4. Increments and histogram observations from 1 and 2 threads: one shared
#    prometheus-client Counter, one each, pollbox's per-worker counters.
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT=${1:-18460}
REF=${2:-/tmp/vs-pc-reference.txt}
BIN=target/release/pollbox
EX=target/release/examples/vs_prometheus_client
cargo build --release -q -p pollbox
cargo build --release -q -p pollbox-benches --example vs_prometheus_client

echo "== reference: $BIN serve --workers 2, load -d 3s --mix poll:50,ingest:50, GET /metrics"
$BIN serve --listen 127.0.0.1:$PORT --workers 2 2>/dev/null &
PID=$!
for _ in $(seq 100); do curl -s -o /dev/null localhost:$PORT/healthz && break; sleep 0.1; done
$BIN load --url http://127.0.0.1:$PORT --mix poll:50,ingest:50 -d 3s -q >/dev/null
curl -s localhost:$PORT/metrics >"$REF"
kill -INT $PID; wait $PID 2>/dev/null || true
echo "families $(grep -c '^# TYPE' "$REF"), series $(grep -vc '^#' "$REF"), bytes $(wc -c <"$REF")," \
  "histograms $(grep -c '^# TYPE .* histogram' "$REF") with $(grep -c '_bucket{' "$REF") buckets (+Inf included)," \
  "per-worker series $(grep -c 'worker="' "$REF"), route/code series $(grep -c '^pollbox_http_requests_total{' "$REF")"

echo
echo "== native: the example's render and encode of the same content"
$EX scrape 3 3000 "$REF"

echo
echo "== callgrind: instructions per scrape (20 scrapes each, same content within the run)"
ITERS=20
OUTF=$(mktemp)
valgrind --tool=callgrind --callgrind-out-file="$OUTF" --collect-atstart=no \
  --toggle-collect='vs_prometheus_client::cg_pollbox' \
  --toggle-collect='vs_prometheus_client::cg_pc_encode' \
  --toggle-collect='vs_prometheus_client::cg_pc_full' \
  $EX callgrind 3 $ITERS "$REF" 2>/dev/null | grep -v '^  differs' || true
callgrind_annotate --inclusive=yes "$OUTF" 2>/dev/null |
  awk -v n=$ITERS '/vs_prometheus_client::cg_/ {
      gsub(",", "", $1); name = $0; sub(/.*vs_prometheus_client::/, "", name); sub(/ .*/, "", name)
      if (seen[name]++) next
      what["cg_pollbox"] = "pollbox render (all gathered)"
      what["cg_pc_encode"] = "prometheus-client encode"
      what["cg_pc_full"] = "prometheus-client /proc+jemalloc+encode"
      printf "%-40s %10d instructions per scrape\n", what[name], $1 / n }'
rm -f "$OUTF"
echo "cross-check, benches/scrape/callgrind.sh (the release binary, idle, 50 scrapes; its content: no load):"
bash benches/scrape/callgrind.sh $BIN $((PORT + 1))

echo
echo "== contention"
$EX contention
