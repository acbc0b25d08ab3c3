#!/usr/bin/env bash
# What a page of a prefix costs the worker, and where it goes (perf), for
# benches/rooms/paging.sh's figures:
#
#   bash benches/rooms/paging-perf.sh   # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# The same server and boxes as paging.sh (one worker on CPU 0, 1,000,000 boxes in
# 10 rooms, room-3/ holding 100,000), nothing else running: benches/rooms/walk.py
# walks room-3/ in pages of ROOMS_LIMIT (1,000) back to back for ROOMS_SECONDS (10)
# s (every walk checked as in paging.sh) while `perf record -e cpu-clock` samples
# the server. Server CPU (/proc/PID/stat) per page and per box, then perf's split
# by DSO and its top symbols. Writes benches/rooms/results/<date>-paging-perf.txt.
source "$(dirname "$0")/lib.sh"
SECS=${ROOMS_SECONDS:-10}
LIMIT=${ROOMS_LIMIT:-1000}
OUT=$RES/$(date -u +%F)-paging-perf${ROOMS_TAG:-}.txt
log_to "$OUT"
header "bash benches/rooms/paging-perf.sh: ROOMS_SECONDS=$SECS ROOMS_LIMIT=$LIMIT"
start_server
L --rooms 10 --keys 1000000 --preseed --mix poll --rate 1 -c 1 --duration 1s -q >/dev/null 2>&1
echo "# loaded $(metric pollbox_boxes) boxes; walking room-3/ in pages of $LIMIT for $SECS s under perf record -e cpu-clock"
perf record -e cpu-clock -F 4999 -p "$SRV" -o "$D/perf.data" -- sleep "$((SECS + 1))" >/dev/null 2>&1 &
pp=$!
sleep 0.5
c0=$(cpu_ticks)
taskset -c 1 python3 benches/rooms/walk.py --url "$(URL)" --prefix room-3/ --limit "$LIMIT" \
    --expect 100000 --seconds "$SECS" | tee "$D/walk.json"
c1=$(cpu_ticks)
wait $pp || true
python3 - "$D/walk.json" "$c0" "$c1" "$TICK" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))
cpu = (float(sys.argv[3]) - float(sys.argv[2])) / float(sys.argv[4])
print(f"server CPU {cpu:.2f} s over {w['seconds']} s: {1e6 * cpu / w['pages']:.0f} us a page of up to "
      f"{w['boxes'] // w['pages']} boxes, {1e6 * cpu / w['boxes']:.2f} us a box ({w['pages']} pages, {w['walks']} walks)")
PY
# (into files first: `head` closing a pipe early would fail it under pipefail)
perf report -i "$D/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' >"$D/dso.txt" || true
perf report -i "$D/perf.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' >"$D/sym.txt" || true
sed -n '1,6s/^/## dso /p' "$D/dso.txt"
echo "## top symbols"
sed -n 1,25p "$D/sym.txt"
# Where in the hottest function: perf annotate's hottest source lines.
hot=$(sed -n '1s/.*\[[.k]\] //p' "$D/sym.txt")
echo "## the hottest lines of $hot (perf annotate, % of its samples)"
perf annotate -i "$D/perf.data" --stdio -l "$hot" 2>/dev/null | grep -E '^\s+[0-9]+\.[0-9]+ ' | sort -rn | head -12 || true
stop_server
machine_state
