#!/usr/bin/env bash
# Server CPU per request: a room's presence read as a box, against a box poll
# (docs/presence.md#what-it-costs; the issue's bound: at most 1.2x), one
# after the other in each round, plain and pipelined:
#
#   bash benches/rooms/presence-read.sh   # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# One server (one worker, CPU 0, benches/rooms/rooms.toml); PRESENCE_MEMBERS
# (1,000) members held present in room-0/ by presence-members.py (1,000 event
# streams, on CPU 1), so the count reads past max_listed (100): the count alone.
# Each round, wrk (one thread, 32 connections, CPU 1) for PRESENCE_SECONDS (8) s on:
#  - box:   GET /v1/boxes/room-0/a (a box of the default fields)
#  - count: GET /v1/boxes/room-0/~presence
#  - page:  GET /v1/boxes/room-0/~presence?limit=100 (the first page: 100 members)
# then each again with 16 requests pipelined a write (benches/rooms/path-pipeline.lua).
# Server CPU from /proc/PID/stat, requests from wrk. Rounds: PRESENCE_REPS (3).
# Writes benches/rooms/results/<date>-presence-read.txt.
source "$(dirname "$0")/lib.sh"
M=${PRESENCE_MEMBERS:-1000}
SECS=${PRESENCE_SECONDS:-8}
REPS=${PRESENCE_REPS:-3}
OUT=$RES/$(date -u +%F)-presence-read${ROOMS_TAG:-}.txt
log_to "$OUT"
header "bash benches/rooms/presence-read.sh: PRESENCE_MEMBERS=$M PRESENCE_SECONDS=$SECS PRESENCE_REPS=$REPS"
start_server
curl -sf -X POST "$(URL)/v1/boxes/room-0/a" -d '{"value":5,"player":"p-1"}' >/dev/null
taskset -c 1 python3 "$ROOT/benches/rooms/presence-members.py" "$PORT" room-0/ "$M" &
BGS="$BGS $!"
wait_metric pollbox_presence_members "$M" 120
echo "# $(metric pollbox_presence_members) members present; count payload: $(curl -s "$(URL)/v1/boxes/room-0/~presence")"
measure() { # name path depth
    local c0 c1 out reqs
    c0=$(cpu_ticks)
    if [ "$3" = 1 ]; then
        out=$(taskset -c 1 wrk -t1 -c32 -d"${SECS}s" "$(URL)$2")
    else
        out=$(taskset -c 1 wrk -t1 -c32 -d"${SECS}s" -s "$ROOT/benches/rooms/path-pipeline.lua" "$(URL)" -- "$2" "$3")
    fi
    c1=$(cpu_ticks)
    reqs=$(echo "$out" | awk '/requests in/ {print $1}')
    local non2xx
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    python3 -c "
import json,sys
c=($c1-$c0)/$TICK; r=$reqs
print(json.dumps({'kind':'$1','depth':$3,'rep':$4,'requests':r,'non_2xx':int('${non2xx:-0}'),'server_cpu_s':round(c,3),'cpu_us_per_request':round(c*1e6/r,3),'requests_per_s':round(r/$SECS,1)}))" | tee -a "$D/runs.jsonl"
}
for rep in $(seq "$REPS"); do
    for depth in 1 16; do
        measure box /v1/boxes/room-0/a "$depth" "$rep"
        measure count /v1/boxes/room-0/~presence "$depth" "$rep"
        measure page "/v1/boxes/room-0/~presence?limit=100" "$depth" "$rep"
    done
done
machine_state
python3 - "$D/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print()
print("# CPU per request against the box poll of the same round and depth (median of rounds)")
for depth in (1, 16):
    for kind in ("count", "page"):
        ratios = []
        for rep in sorted({r["rep"] for r in runs}):
            get = lambda k: next(r for r in runs if r["kind"] == k and r["depth"] == depth and r["rep"] == rep)
            ratios.append(get(kind)["cpu_us_per_request"] / get("box")["cpu_us_per_request"])
        print(f"{kind} / box, depth {depth}: median {statistics.median(ratios):.2f}x  ({', '.join(f'{x:.2f}' for x in ratios)})")
PY
