#!/usr/bin/env bash
# pollbox's event streams and long-polls side by side with Nchan, in one run:
#
#   bash benches/event-streams/vs-nchan.sh [results-file]     # BENCH_NO_BUILD=1: use target/release/pollbox as is
#   PHASES="slow ssemem" bash benches/event-streams/vs-nchan.sh  # some parts only (fanout single memory slow ssemem)
#
# Installs nginx-light and libnginx-mod-nchan (Debian), runs nginx with one worker
# (an Nchan publisher location, an EventSource subscriber location and a long-poll
# one, message buffer of 1) and pollbox with one worker (the embedded default
# config, max_connections raised to 20,000 for the 10,000-stream run; a second
# pollbox with io_uring = true). Every server is pinned to CPU 0, the client
# (benches/event-streams/fanout.py, Python stdlib only, the same for both servers) to CPU 1.
# A third "server", benches/event-streams/floor.py, does nothing per delivery but one
# send(): its system time is the kernel's share of any server's fan-out.
#
# Measures:
#  - fan-out: one update to 1,000 subscribers of one key, 50 publishes, 3 runs
#    (interleaved): publish-to-last-delivery p50 (kernel receive timestamps),
#    the publisher's own answer time, server CPU per delivered event (user and
#    system apart, /proc/PID/stat; total from schedstat);
#  - one subscriber: publish-to-delivery p50 over 200 publishes;
#  - memory per open stream: 10,000 streams on 1,000 keys (RSS delta / streams),
#    fresh servers;
#  - a subscriber that never reads: server RSS (and pollbox's accounted bytes)
#    and the server socket's Send-Q before and after 100,000 updates to its key, then how many events it gets
#    when it reads at last, and whether the newest version is among them;
#  - benches/event-streams/memory.sh again (pollbox's own load generator).
# Raw JSON lines go to the results file (default
# benches/event-streams/results/<date>-vs-nchan.txt),
# the summary table to stdout and the end of that file.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
OUT=${1:-benches/event-streams/results/$(date -u +%F)-vs-nchan.txt}
RUNS=${RUNS:-3}
PUBLISHES=${PUBLISHES:-50}
SUBS=${SUBS:-1000}

if ! [ -f /usr/lib/nginx/modules/ngx_nchan_module.so ] || ! command -v nginx >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends nginx-light libnginx-mod-nchan >/dev/null
fi
# Debian starts nginx as a service on install; this bench runs its own.
systemctl stop nginx >/dev/null 2>&1 || true
if [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
    cargo build --release -q -p pollbox
fi
B=$ROOT/target/release/pollbox
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true   # 10,000 streams on each side (20,000 here)

D=$(mktemp -d /tmp/nchan-bench.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NPORT=$(free_port); PPORT=$(free_port); UPORT=$(free_port); FPORT=$(free_port)
NGINX_MASTER=""; PBX=""; PBXU=""; FLOOR=""
UPDATES=${UPDATES:-100000}
# Which parts to run (all by default); the results file is appended to.
PHASES=${PHASES:-"fanout single memory slow ssemem"}
has() { [[ " $PHASES " == *" $1 "* ]]; }

cat >"$D/nginx.conf" <<EOF
load_module /usr/lib/nginx/modules/ngx_nchan_module.so;
worker_processes 1;
worker_rlimit_nofile 20000;
daemon off;
pid $D/nginx.pid;
error_log $D/nginx-error.log warn;
events { worker_connections 19000; }
http {
    access_log off;
    client_body_temp_path $D/body;
    proxy_temp_path $D/proxy;
    fastcgi_temp_path $D/fastcgi;
    uwsgi_temp_path $D/uwsgi;
    scgi_temp_path $D/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    nchan_message_buffer_length 1;
    nchan_message_timeout 1h;
    server {
        listen 127.0.0.1:$NPORT backlog=4096;
        location ~ ^/pub/(.+)\$ {
            nchan_publisher;
            nchan_channel_id \$1;
            nchan_message_buffer_length 1;
        }
        location ~ ^/es/(.+)\$ {
            nchan_subscriber eventsource;
            nchan_channel_id \$1;
            nchan_message_buffer_length 1;
        }
        location ~ ^/lp/(.+)\$ {
            nchan_subscriber longpoll;
            nchan_channel_id \$1;
            nchan_message_buffer_length 1;
        }
    }
}
EOF
cp config/pollbox.toml "$D/pollbox.toml"
sed -i 's/^max_connections = .*/max_connections = 20000/' "$D/pollbox.toml"
cp "$D/pollbox.toml" "$D/pollbox-uring.toml"
sed -i 's/^io_uring = false/io_uring = true/' "$D/pollbox-uring.toml"

wait_port() { for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 did not open" >&2; return 1; }
start() {
    taskset -c 0 nginx -c "$D/nginx.conf" -p "$D" >"$D/nginx.out" 2>&1 &
    NGINX_MASTER=$!
    taskset -c 0 "$B" serve --config "$D/pollbox.toml" --listen 127.0.0.1:$PPORT --workers 1 >"$D/pollbox.log" 2>&1 &
    PBX=$!
    taskset -c 0 "$B" serve --config "$D/pollbox-uring.toml" --listen 127.0.0.1:$UPORT --workers 1 >"$D/pollbox-uring.log" 2>&1 &
    PBXU=$!
    # The kernel's floor: a server that does nothing per delivery but one send().
    taskset -c 0 python3 benches/event-streams/floor.py $FPORT >"$D/floor.log" 2>&1 &
    FLOOR=$!
    wait_port $NPORT; wait_port $PPORT; wait_port $UPORT; wait_port $FPORT
    NGINX_WORKER=$(pgrep -P $NGINX_MASTER | head -1)
}
stop() {
    for p in $PBX $PBXU; do kill -INT $p 2>/dev/null || true; wait $p 2>/dev/null || true; done
    # (a background job ignores SIGINT, and Python keeps it ignored: TERM)
    if [ -n "$FLOOR" ]; then kill -TERM $FLOOR 2>/dev/null || true; wait $FLOOR 2>/dev/null || true; fi
    if [ -n "$NGINX_MASTER" ]; then kill -QUIT $NGINX_MASTER 2>/dev/null || true; wait $NGINX_MASTER 2>/dev/null || true; fi
    PBX=""; PBXU=""; FLOOR=""; NGINX_MASTER=""
}
trap 'stop; rm -rf "$D"' EXIT

C() { taskset -c 1 python3 benches/event-streams/fanout.py "$@" | tee -a "$OUT"; }
# target: name server kind port pid
targets() {
    echo "nchan-es nchan sse $NPORT $NGINX_WORKER"
    echo "nchan-lp nchan lp $NPORT $NGINX_WORKER"
    echo "pollbox-sse pollbox sse $PPORT $PBX"
    echo "pollbox-lp pollbox lp $PPORT $PBX"
    echo "pollbox-uring-sse pollbox sse $UPORT $PBXU"
    echo "pollbox-uring-lp pollbox lp $UPORT $PBXU"
    echo "floor-send-only pollbox sse $FPORT $FLOOR"
}

{
    echo "# benches/event-streams/vs-nchan.sh $(date -u +%FT%TZ) on $(hostname): $(nproc) cores, $(uname -r)"
    echo "# $(nginx -v 2>&1); nchan $(dpkg-query -W -f '${Version}' libnginx-mod-nchan); pollbox $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes')"
    echo "# servers on CPU 0, client on CPU 1; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$OUT"

start
if has fanout; then
echo "## fan-out: $SUBS subscribers of one key, $PUBLISHES publishes, $RUNS runs" | tee -a "$OUT"
for r in $(seq "$RUNS"); do
    while read -r name server kind port pid; do
        C fanout --label "$name" --server "$server" --kind "$kind" --port "$port" --pid "$pid" --subs "$SUBS" --publishes "$PUBLISHES"
    done < <(targets)
done
fi
if has single; then
echo "## one subscriber: 200 publishes" | tee -a "$OUT"
while read -r name server kind port pid; do
    C single --label "$name" --server "$server" --kind "$kind" --port "$port" --pid "$pid" --publishes 200
done < <(targets | grep -v '^floor')
fi
stop

if has memory; then

echo "## memory per open stream: 10,000 streams on 1,000 keys (fresh servers each)" | tee -a "$OUT"
for t in nchan-es nchan-lp pollbox-sse pollbox-lp; do
    start
    read -r name server kind port pid < <(targets | grep "^$t ")
    C memory --label "$name" --server "$server" --kind "$kind" --port "$port" --pid "$pid" --streams 10000 --keys 1000
    stop
done
fi

if has slow; then

echo "## a subscriber that never reads: $UPDATES updates to its key (at most 60 s of publishing)" | tee -a "$OUT"
start
for t in nchan-es pollbox-sse pollbox-uring-sse; do
    read -r name server kind port pid < <(targets | grep "^$t ")
    C slow --label "$name" --server "$server" --port "$port" --pid "$pid" --updates "$UPDATES" --max-seconds 60
done
stop
fi

if has ssemem; then

echo "## benches/event-streams/memory.sh (pollbox load --sse 10000, unpinned), same run" | tee -a "$OUT"
bash benches/event-streams/memory.sh 2>&1 | tee -a "$OUT"
fi

echo "## summary (medians over runs)" | tee -a "$OUT"
python3 benches/event-streams/summary.py "$OUT" | tee -a "$OUT"
