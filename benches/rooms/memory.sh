#!/usr/bin/env bash
# Memory per idle event stream: 10,000 prefix streams on 10,000 different prefixes,
# 10,000 on one prefix, and 10,000 one-box streams, side by side in one run:
#
#   bash benches/rooms/memory.sh     # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# A fresh server per measurement (one worker, CPU 0, benches/rooms/rooms.toml),
# ROOMS_STREAMS (10,000) boxes in as many rooms, pre-seeded (`pollbox load
# --rooms N --keys N`: box room-i/lg-i), so every kind of stream is sent exactly
# one box when it opens and nothing after:
#  - distinct: prefix stream i on room-i/ (`--prefix-streams N`, `room-{i%N}/`);
#  - same:     every prefix stream on room-0/ (`--prefix room-0/`);
#  - onebox:   stream i on the box room-i/lg-i (`--sse N`).
# The generator (CPU 1) holds the streams and polls 10 boxes a second (nothing
# moves). Before the streams and 2 s after the last one opened: RSS
# (/proc/PID/status), accounted bytes (pollbox_accounted_bytes) and jemalloc's
# allocated bytes; per stream = delta / streams. ROOMS_REPS (2) rounds of the
# three, alternated. Writes benches/rooms/results/<date>-memory.txt.
source "$(dirname "$0")/lib.sh"
N=${ROOMS_STREAMS:-10000}
REPS=${ROOMS_REPS:-2}
OUT=$RES/$(date -u +%F)-memory${ROOMS_TAG:-}.txt

run_one() { # kind rep
    local kind=$1 rep=$2 streams=()
    case $kind in
        distinct) streams=(--prefix-streams "$N") ;;
        same) streams=(--prefix-streams "$N" --prefix room-0/) ;;
        onebox) streams=(--sse "$N") ;;
    esac
    start_server
    L --rooms "$N" --keys "$N" --preseed --mix poll --rate 1 -c 1 --duration 1s -q >/dev/null
    sleep 1
    local r0 a0 j0 r1 a1 j1 subs prefixes
    r0=$(rss); a0=$(accounted); j0=$(metric pollbox_jemalloc_allocated_bytes)
    Lbg "$D/$kind-$rep.txt" --rooms "$N" --keys "$N" --mix poll --rate 10 -c 1 --duration 600s \
        "${streams[@]}" -q
    local lp=$BG
    wait_metric pollbox_sse_subscribers "$N" 120
    sleep 2
    r1=$(rss); a1=$(accounted); j1=$(metric pollbox_jemalloc_allocated_bytes)
    subs=$(metric pollbox_sse_subscribers); prefixes=$(metric pollbox_prefix_streams)
    kill -TERM "$lp" 2>/dev/null || true   # (a background job ignores SIGINT)
    wait $lp 2>/dev/null || true
    stop_server
    python3 - "$kind" "$rep" "$r0" "$r1" "$a0" "$a1" "$j0" "$j1" "$subs" "$prefixes" <<'PY'
import json, sys
kind, rep = sys.argv[1], int(sys.argv[2])
r0, r1, a0, a1, j0, j1, subs, prefixes = (float(x) for x in sys.argv[3:11])
print(json.dumps({
    "kind": kind, "rep": rep, "streams": int(subs), "prefix_streams": int(prefixes),
    "rss_before": int(r0), "rss_open": int(r1),
    "rss_per_stream": round((r1 - r0) / subs, 1),
    "accounted_per_stream": round((a1 - a0) / subs, 1),
    "jemalloc_per_stream": round((j1 - j0) / subs, 1),
}))
PY
}

log_to "$OUT"
header "bash benches/rooms/memory.sh: ROOMS_STREAMS=$N ROOMS_REPS=$REPS"
echo "# per round, a fresh server each: distinct ($N prefix streams, room-i/), same ($N prefix streams of room-0/), onebox ($N streams of one box)"
rounds distinct same onebox
machine_state
python3 - "$D/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = statistics.median
print()
print(f"{'kind':>8} {'RSS B/stream':>13} {'accounted':>10} {'jemalloc':>9}   (medians of {len(runs) // 3} rounds)")
rss = {}
for kind in ("distinct", "same", "onebox"):
    rs = [r for r in runs if r["kind"] == kind]
    rss[kind] = med(r["rss_per_stream"] for r in rs)
    print(f"{kind:>8} {rss[kind]:>13.0f} {med(r['accounted_per_stream'] for r in rs):>10.0f} {med(r['jemalloc_per_stream'] for r in rs):>9.0f}")
for kind in ("distinct", "same"):
    print(f"prefix streams ({kind}): {rss[kind]:.0f} B RSS a stream, {rss[kind] / rss['onebox']:.2f}x a one-box stream's; goal <= 1.5 KB (1,500 B): {'met' if rss[kind] <= 1500 else 'NOT met'}")
PY
