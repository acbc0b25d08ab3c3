#!/usr/bin/env bash
# Pages of a prefix while ingest runs: every box of a 100,000-box room seen exactly
# once a walk, and poll latency beside the walks against without them, in one run:
#
#   bash benches/rooms/paging.sh     # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# One server (one worker, CPU 0, benches/rooms/rooms.toml) holding 1,000,000 boxes
# in 10 rooms, loaded with batch ingest (`pollbox load --rooms 10 --keys 1000000
# --preseed`: 100 messages a POST /v1/ingest; key n is room-<n % 10>/lg-<n>), so
# room-3/ (the walked room, the brief's room-big/) holds 100,000 of them and the
# other 900,000 are in other rooms. Then windows of ROOMS_SECONDS (15) s, each
# with, on CPU 1:
#  - ingest: batch ingest of updates to all 1,000,000 keys (so a tenth land in
#    room-3/), ROOMS_INGEST (50,000) messages/s, 100 a batch, open loop;
#  - polls: `pollbox load --mix poll`, ROOMS_POLLS (5,000)/s open loop over 50
#    connections, uniform over the 1,000,000 keys (nine in ten in other rooms):
#    its p99 is the measure;
#  - beside only: benches/rooms/walk.py walking room-3/ in pages of ROOMS_LIMIT
#    (1,000: GET /v1/boxes?prefix=room-3/&limit=1000&cursor=...) back to back; every
#    walk asserts 100,000 keys, all under room-3/, in strictly increasing order
#    (so each seen once), else the script fails. ROOMS_WALK_EVERY=S: a walk
#    starts every S seconds instead (one walk of 100 pages, then nothing).
# Windows alternate without, beside: ROOMS_REPS (3) pairs. Poll p99 beside / without
# per pair, and the median. The generators share CPU 1 with the walker (SCHED_IDLE,
# so that they go first): their own send lateness is printed beside. Writes benches/rooms/results/<date>-paging.txt.
source "$(dirname "$0")/lib.sh"
SECS=${ROOMS_SECONDS:-15}
INGEST=${ROOMS_INGEST:-50000}
POLLS=${ROOMS_POLLS:-5000}
REPS=${ROOMS_REPS:-3}
LIMIT=${ROOMS_LIMIT:-1000}
EVERY=${ROOMS_WALK_EVERY:-0}
KEYS=1000000
ROOMS=10
ROOM=room-3/
OUT=$RES/$(date -u +%F)-paging${ROOMS_TAG:-}.txt

window() { # mode rep
    local mode=$1 rep=$2 wp="" lp ip
    L --rooms $ROOMS --keys $KEYS --mix batch --batch-size 100 --rate "$((INGEST / 100))" -c 4 \
        --duration "$((SECS + 3))s" -q --json "$D/ingest-$mode-$rep.json" >"$D/ingest-$mode-$rep.txt" 2>&1 &
    ip=$!
    sleep 1
    if [ "$mode" = beside ]; then
        taskset -c 1 chrt --idle 0 python3 benches/rooms/walk.py --url "$(URL)" --prefix $ROOM \
            --limit "$LIMIT" --expect $((KEYS / ROOMS)) --seconds "$((SECS + 1))" --every "$EVERY" \
            >"$D/walk-$rep.json" &
        wp=$!
    fi
    L --rooms $ROOMS --keys $KEYS --mix poll --rate "$POLLS" -c 50 --warmup 1s --duration "${SECS}s" \
        -q --json "$D/poll-$mode-$rep.json" >"$D/poll-$mode-$rep.txt" 2>&1 &
    lp=$!
    local failed=0
    wait $lp || { echo "polls failed ($mode $rep):"; cat "$D/poll-$mode-$rep.txt"; failed=1; } >&2
    if [ -n "$wp" ]; then
        wait $wp || { echo "walk.py FAILED ($rep): see above" >&2; failed=1; }
    fi
    wait $ip || { echo "ingest failed ($mode $rep):"; cat "$D/ingest-$mode-$rep.txt"; failed=1; } >&2
    python3 - "$mode" "$rep" "$D/poll-$mode-$rep.json" "$D/ingest-$mode-$rep.json" "$D/walk-$rep.json" <<'PY'
import json, os, sys
mode, rep, poll, ingest, walk = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
p, i = json.load(open(poll)), json.load(open(ingest))
out = {"mode": mode, "rep": rep,
       "poll_rate": round(p["achieved_rate"], 1), "poll_p50_ms": p["latency_ms"]["p50"],
       "poll_p99_ms": p["latency_ms"]["p99"], "poll_p999_ms": p["latency_ms"]["p999"],
       "poll_errors": p["errors_total"], "poll_not_found": p["ops"][0]["not_found"],
       "generator_lateness_p99_ms": p["send_lateness_ms"]["p99"],
       "ingest_msgs_per_s": round(i["messages_per_s"], 1), "ingest_errors": i["errors_total"]}
if mode == "beside":
    out["walk"] = json.load(open(walk))
print(json.dumps(out))
PY
    return $failed
}

log_to "$OUT"
header "bash benches/rooms/paging.sh: ROOMS_SECONDS=$SECS ROOMS_INGEST=$INGEST ROOMS_POLLS=$POLLS ROOMS_REPS=$REPS ROOMS_LIMIT=$LIMIT ROOMS_WALK_EVERY=$EVERY"
start_server
t0=$(date +%s.%N)
L --rooms $ROOMS --keys $KEYS --preseed --mix poll --rate 1 -c 1 --duration 1s -q >"$D/preseed.txt" 2>&1
t1=$(date +%s.%N)
echo "# loaded $(metric pollbox_boxes) boxes by batch ingest ($(grep -o '[0-9]* pre-seed' "$D/preseed.txt" | head -1 || true) requests; $(python3 -c "print(round($t1 - $t0, 1))") s); RSS $(rss) B"
echo "# a first walk of $ROOM with nothing else running:"
taskset -c 1 python3 benches/rooms/walk.py --url "$(URL)" --prefix $ROOM --limit "$LIMIT" --expect $((KEYS / ROOMS))
failed=0
for rep in $(seq "$REPS"); do
    for mode in without beside; do
        window "$mode" "$rep" >"$D/last" || failed=1
        cat "$D/last"
        cat "$D/last" >>"$D/windows.jsonl"
    done
done
echo "# boxes at the end: $(metric pollbox_boxes)"
machine_state
python3 - "$D/windows.jsonl" <<'PY'
import json, statistics, sys
ws = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for w in ws:
    by.setdefault(w["rep"], {})[w["mode"]] = w
print()
print(f"{'pair':>4} {'poll p99 without':>17} {'beside':>8} {'ratio':>6} {'p50 without':>12} {'beside':>7} {'walks':>6} {'page p50 / p99 ms':>18} {'gen. lateness p99 ms':>21}")
ratios = []
for rep in sorted(by):
    a, b = by[rep].get("without"), by[rep].get("beside")
    if not (a and b):
        continue
    ratios.append(b["poll_p99_ms"] / a["poll_p99_ms"])
    w = b["walk"]
    print(f"{rep:>4} {a['poll_p99_ms']:>17.3f} {b['poll_p99_ms']:>8.3f} {ratios[-1]:>6.2f} {a['poll_p50_ms']:>12.3f} {b['poll_p50_ms']:>7.3f} "
          f"{w['walks']:>6} {w['page_ms']['p50']:>8.3f} / {w['page_ms']['p99']:<7.3f} {a['generator_lateness_p99_ms']:>9.3f} / {b['generator_lateness_p99_ms']:.3f}")
walks = sum(by[r]["beside"]["walk"]["walks"] for r in by if "beside" in by[r])
print(f"every walk ({walks}) saw each of room-3/'s 100,000 boxes exactly once, in key order")
print(f"median poll p99 beside / without: {statistics.median(ratios):.2f} (goal <= 1.2)")
PY
exit $failed
