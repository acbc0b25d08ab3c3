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
# Beside it, in each round, the floor (benches/rooms/answer-floor.c, CPU 0): a
# server that only counts requests and writes pollbox's own answers to the box
# poll and to the page (heads and bodies, taken from pollbox at the start) with
# one writev of iovecs on the same bytes: what those bytes alone cost.
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
# pollbox's answers, head and body, as wrk's requests get them.
answer() { # path file
    python3 - "$PORT" "$1" "$2" <<'PY'
import socket, sys
port, path, out = sys.argv[1:]
s = socket.create_connection(("127.0.0.1", int(port)))
s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
buf = b""
while b"\r\n\r\n" not in buf:
    buf += s.recv(65536)
head, _, body = buf.partition(b"\r\n\r\n")
n = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")))
while len(body) < n:
    body += s.recv(65536)
open(out, "wb").write(head + b"\r\n\r\n" + body[:n])
PY
}
answer /v1/boxes/room-0/a "$D/box.answer"
answer "/v1/boxes/room-0/~presence?limit=100" "$D/page.answer"
cc -O2 -o "$D/answer-floor" "$ROOT/benches/rooms/answer-floor.c"
FLOOR_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
taskset -c 0 "$D/answer-floor" "$FLOOR_PORT" "$D/box.answer" "$D/page.answer" '~presence' &
FLOOR=$!
BGS="$BGS $FLOOR"
sleep 0.2
echo "# answers: box $(wc -c <"$D/box.answer") B, page $(wc -c <"$D/page.answer") B (heads included); the floor on port $FLOOR_PORT, pid $FLOOR"
source "$ROOT/benches/rooms/wrk-cpu.sh"
measure() { # name path depth rep [port pid]
    local reqs ticks non2xx
    read -r reqs ticks non2xx < <(wrk_cpu "${5:-$PORT}" "$2" "$3" "${6:-$SRV}" "$SECS")
    python3 -c "
import json,sys
c=$ticks/$TICK; r=$reqs
print(json.dumps({'kind':'$1','depth':$3,'rep':$4,'requests':r,'non_2xx':$non2xx,'server_cpu_s':round(c,3),'cpu_us_per_request':round(c*1e6/r,3),'requests_per_s':round(r/$SECS,1)}))" | tee -a "$D/runs.jsonl"
}
for rep in $(seq "$REPS"); do
    for depth in 1 16; do
        measure box /v1/boxes/room-0/a "$depth" "$rep"
        measure count /v1/boxes/room-0/~presence "$depth" "$rep"
        measure page "/v1/boxes/room-0/~presence?limit=100" "$depth" "$rep"
        measure floor-box /v1/boxes/room-0/a "$depth" "$rep" "$FLOOR_PORT" "$FLOOR"
        measure floor-page "/v1/boxes/room-0/~presence?limit=100" "$depth" "$rep" "$FLOOR_PORT" "$FLOOR"
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
print()
print("# what the page's bytes add, µs a request (median of rounds): pollbox against the floor")
for depth in (1, 16):
    rows = {}
    for rep in sorted({r["rep"] for r in runs}):
        get = lambda k: next(r for r in runs if r["kind"] == k and r["depth"] == depth and r["rep"] == rep)["cpu_us_per_request"]
        for name, page, box in (("pollbox", "page", "box"), ("floor", "floor-page", "floor-box")):
            rows.setdefault(name, []).append((get(page) - get(box), get(page) / get(box), get(box), get(page)))
    for name, v in rows.items():
        med = lambda i: statistics.median(x[i] for x in v)
        print(f"depth {depth}: {name:8s} box {med(2):.3f} µs, page {med(3):.3f} µs: page - box {med(0):+.3f} µs, page / box {med(1):.2f}x")
    extra = statistics.median(p[0] - f[0] for p, f in zip(rows["pollbox"], rows["floor"]))
    print(f"depth {depth}: pollbox's page costs {extra:+.3f} µs a request over what its bytes alone cost the floor")
PY
