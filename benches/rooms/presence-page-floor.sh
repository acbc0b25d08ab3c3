#!/usr/bin/env bash
# The floor under "a presence page costs at most 1.2x a box poll" (docs/presence.md):
# nginx answering a fixed 70-byte body (a box's payload) and a fixed 1,900-byte body
# (a first page of 100 members) with `return 200`, one worker on CPU 0, wrk on CPU 1,
# plain (32 connections) and 16 pipelined a write: server CPU per request from
# /proc/PID/stat, as benches/rooms/presence-read.sh measures pollbox. The ratio
# page/box is what the bytes alone cost a server that does nothing else.
#
#   bash benches/rooms/presence-page-floor.sh   # results/<date>-presence-page-floor.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
D=$(mktemp -d /tmp/page-floor.XXXXXX)
OUT=$ROOT/benches/rooms/results/$(date -u +%F)-presence-page-floor.txt
SECS=${FLOOR_SECONDS:-8}
REPS=${FLOOR_REPS:-3}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BOX=$(python3 -c 'print("{\"k\":\"room-0/a\",\"ver\":1796205607834803,\"v\":5,\"sum\":5,\"n\":1}")')
PAGE=$(python3 -c 'import json; print(json.dumps({"k":"room-0/~presence","ver":1796205607834803,"count":1000,"members":[{"id":"m-%06d"%i} for i in range(100)],"next":"6d2d303030303939"},separators=(",",":")))')
mkdir -p "$D/body" "$D/proxy" "$D/fastcgi" "$D/uwsgi" "$D/scgi"
cat >"$D/nginx.conf" <<CONF
worker_processes 1;
daemon off;
master_process on;
pid $D/nginx.pid;
error_log $D/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    server_tokens off;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
    client_body_temp_path $D/body;
    proxy_temp_path $D/proxy;
    fastcgi_temp_path $D/fastcgi;
    uwsgi_temp_path $D/uwsgi;
    scgi_temp_path $D/scgi;
    default_type application/json;
    server {
        listen 127.0.0.1:$PORT;
        location = /box { return 200 '$BOX'; }
        location = /page { return 200 '$PAGE'; }
    }
}
CONF
taskset -c 0 nginx -c "$D/nginx.conf" -p "$D" >/dev/null 2>&1 &
MASTER=$!
trap 'kill $MASTER 2>/dev/null || true; rm -rf "$D"' EXIT
sleep 1
WPID=$(pgrep -P "$MASTER" | head -1)
TICK=$(getconf CLK_TCK)
exec > >(tee "$OUT") 2>&1
echo "# bash benches/rooms/presence-page-floor.sh: FLOOR_SECONDS=$SECS FLOOR_REPS=$REPS"
echo "# $(date -u +%FT%TZ) on $(hostname): $(nproc) cores; $(nginx -v 2>&1); worker pid $WPID on CPU 0, wrk on CPU 1"
echo "# box body $(curl -s "127.0.0.1:$PORT/box" | wc -c) B, page body $(curl -s "127.0.0.1:$PORT/page" | wc -c) B"
source "$ROOT/benches/rooms/wrk-cpu.sh"
measure() { # path depth rep
    local reqs ticks non2xx
    read -r reqs ticks non2xx < <(wrk_cpu "$PORT" "$1" "$2" "$WPID" "$SECS")
    python3 -c "
import json
c=$ticks/$TICK; r=$reqs
print(json.dumps({'path':'$1','depth':$2,'rep':$3,'requests':r,'cpu_us_per_request':round(c*1e6/r,3)}))" | tee -a "$D/runs.jsonl"
}
for rep in $(seq "$REPS"); do
    for depth in 1 16; do
        measure /box "$depth" "$rep"
        measure /page "$depth" "$rep"
    done
done
python3 - "$D/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print()
for depth in (1, 16):
    ratios = []
    for rep in sorted({r["rep"] for r in runs}):
        get = lambda p: next(r for r in runs if r["path"] == p and r["depth"] == depth and r["rep"] == rep)
        ratios.append(get("/page")["cpu_us_per_request"] / get("/box")["cpu_us_per_request"])
    print(f"nginx page / box, depth {depth}: median {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})")
PY
