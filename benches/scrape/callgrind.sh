#!/usr/bin/env bash
# Instructions in pollbox_server::metrics::render over 50 scrapes of a two-worker
# server (callgrind, collection on inside render only).
#
#   bash benches/scrape/callgrind.sh [BINARY] [PORT]
BIN=${1:-target/release/pollbox} PORT=${2:-18450}
OUTF=$(mktemp)
valgrind --tool=callgrind --callgrind-out-file=$OUTF --collect-atstart=no \
  --toggle-collect='pollbox_server::metrics::render*' $BIN serve --listen 127.0.0.1:$PORT --workers 2 2>/dev/null &
PID=$!
for i in $(seq 300); do curl -s -o /dev/null localhost:$PORT/healthz && break; sleep 0.2; done
for i in $(seq 50); do curl -s -o /dev/null localhost:$PORT/metrics; done
kill -INT $PID; wait $PID 2>/dev/null
callgrind_annotate $OUTF 2>/dev/null | grep -m1 "PROGRAM TOTALS"
