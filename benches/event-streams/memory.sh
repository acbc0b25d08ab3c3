#!/usr/bin/env bash
# Memory per open event stream: 10,000 streams on 1,000 keys, one worker (release build:
#   cargo build --release -p pollbox && bash benches/event-streams/memory.sh).
# RSS, accounted bytes and jemalloc allocated, before and while the streams are open,
# per stream; the load generator holds the streams (--sse) and ingests 100/s.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=target/release/pollbox
port=18710
cfg=$(mktemp --suffix=.toml)
ulimit -n 30000 2>/dev/null || true   # 10,000 streams on each side
cp config/pollbox.toml $cfg
sed -i 's/^max_connections = .*/max_connections = 20000/' $cfg
$B serve --config $cfg --listen 127.0.0.1:$port --workers 1 >/tmp/sse-mem-serve.log 2>&1 &
pid=$!
sleep 1
metric() { curl -s 127.0.0.1:$port/metrics | awk -v m="$1" '$1==m {print $2}'; }
acc() { curl -s 127.0.0.1:$port/metrics | awk '/^pollbox_accounted_bytes/ {s+=$2} END {print s}'; }
rss() { awk '/VmRSS/ {print $2*1024}' /proc/$pid/status; }
# Seed the 1,000 keys, then a baseline.
$B load --url http://127.0.0.1:$port --connections 1 --duration 1s --mix ingest:1 --keys 1000 --preseed -q >/dev/null
sleep 1
r0=$(rss); a0=$(acc); j0=$(metric pollbox_jemalloc_allocated_bytes)
$B load --url http://127.0.0.1:$port --connections 1 --duration 12s --rate 100 --mix ingest:1 --keys 1000 --sse 10000 -q --json /tmp/sse-mem-load.json >/tmp/sse-mem-load.txt &
lp=$!
sleep 8
subs=$(metric pollbox_sse_subscribers)
r1=$(rss); a1=$(acc); j1=$(metric pollbox_jemalloc_allocated_bytes)
wait $lp || true
echo "subscribers $subs"
echo "rss: $r0 -> $r1 = $(( (r1 - r0) / subs )) B/stream"
echo "accounted: $a0 -> $a1 = $(python3 -c "print(int(($a1 - $a0) / $subs))") B/stream"
echo "jemalloc allocated: $j0 -> $j1 = $(python3 -c "print(int(($j1 - $j0) / $subs))") B/stream"
cat /tmp/sse-mem-load.txt | grep -E "^(op|ingest|sse)"
kill -INT $pid; wait $pid || true
