#!/usr/bin/env bash
# Many boxes on one connection (GET /v1/boxes?keys=...) against one box a
# connection, in one run (docs/http.md "Many boxes at once"):
#
#   bash benches/many/run.sh                 # builds target/release/pollbox first
#   BENCH_NO_BUILD=1 bash benches/many/run.sh     # target/release/pollbox as it is
#   POLLBOX_BIN=path [POLLBOX_REV=label] bash benches/many/run.sh   # a binary built elsewhere
#   PARTS="events" bash benches/many/run.sh  # some parts only (memory events interleaved polls)
#
# pollbox runs with one worker pinned to CPU 0 (a fresh one per measurement for
# memory and events); the client, benches/many/many.py (Python stdlib only), on
# CPU 1. The binary is copied first, so a build in the same tree during the run
# changes nothing. Each part writes its raw JSON lines and a summary table of
# medians to benches/many/results/<date>-<part>.txt:
#
#  - memory: 6,400 streams of all 64 boxes against 6,400 streams of one box
#    (100 pages' worth): RSS, accounted and jemalloc bytes per stream, open and
#    after an update to every box; 2 fresh servers each, alternated;
#  - events: 1,000 subscribers, each with one stream of box-63 or one stream of
#    all 64 boxes (box-63 last), 20 posts/s to box-63 for 5 s: server CPU per
#    delivered event (pollbox_sse_events_total); a publisher alone gives the
#    publishing's own CPU; 7 rounds of none, single, many (the VM's system time
#    swings ±30 % between windows: read the median of the rounds' ratios);
#  - interleaved: the same with both kinds open on one server (1,000 streams of
#    box-64 alone, 1,000 of box-00..box-63): 1 s windows posting to box-64 and to
#    box-63 alternate, 10 pairs a round, 3 fresh servers; median of the pairs' ratios;
#  - polls: a page of 20 boxes read as one GET /v1/boxes?keys=..., as 20 GETs
#    one after the other, or as 20 GETs pipelined; answers 200 and 304
#    (If-None-Match); closed loop on 1 connection, then on 16; server CPU per
#    page; 3 rounds, alternated.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PARTS=${PARTS:-"memory events interleaved polls"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
DATE=$(date -u +%F)
RES=benches/many/results
mkdir -p "$RES"

D=$(mktemp -d /tmp/many-bench.XXXXXX)
trap 'rm -rf "$D"' EXIT
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
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true   # 6,400 streams on each side

header() {
    echo "# $1 $(date -u +%FT%TZ) on $(hostname): $(nproc) cores ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), $(uname -r)"
    echo "# pollbox $REV (sha256 $(sha256sum "$B" | cut -c1-12)), one worker on CPU 0; client benches/many/many.py on CPU 1"
    echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
}
C() { taskset -c 1 python3 benches/many/many.py "$@" --bin "$B" --root "$ROOT"; }

if has memory; then
    OUT=$RES/$DATE-memory.txt
    { header "bash benches/many/run.sh (memory): many.py memory --streams 6400 --reps 2"; C memory --streams 6400 --reps 2; } 2>&1 | tee "$OUT"
fi
if has events; then
    OUT=$RES/$DATE-events.txt
    { header "bash benches/many/run.sh (events): many.py events --subs 1000 --rate 20 --seconds 5 --reps 7"; C events --subs 1000 --rate 20 --seconds 5 --reps 7; } 2>&1 | tee "$OUT"
fi
if has interleaved; then
    OUT=$RES/$DATE-interleaved.txt
    { header "bash benches/many/run.sh (interleaved): many.py interleaved --subs 1000 --rate 20 --seconds 1 --windows 10 --reps 3"; C interleaved --subs 1000 --rate 20 --seconds 1 --windows 10 --reps 3; } 2>&1 | tee "$OUT"
fi
if has polls; then
    OUT=$RES/$DATE-polls.txt
    {
        header "bash benches/many/run.sh (polls): many.py polls --boxes 20 --conns {1,16} --seconds 4 --reps 3"
        echo "## 1 connection"
        C polls --boxes 20 --conns 1 --seconds 4 --reps 3
        echo "## 16 connections"
        C polls --boxes 20 --conns 16 --seconds 4 --reps 3
    } 2>&1 | tee "$OUT"
fi
