#!/usr/bin/env bash
# benches/log/rolling.sh: a rolling restart of every broker, then of every
# pollbox node, under load, behind HAProxy (docs/operations.md, "Rolling restarts").
#
# Starts three Kafka brokers (scripts/kafka/start.sh --brokers 3), the topic
# pollbox (4 partitions, replication factor 3, min.insync.replicas 2), NODES
# pollbox nodes on it (workers = 1, each with its snapshot, so a restart replays
# only from there) and HAProxy in front (deploy/haproxy/haproxy-replicas.cfg.tmpl).
# Then, while `pollbox load` sends RATE requests/s through HAProxy (half
# ingest, half poll, open-loop, in back-to-back slices of SLICE seconds) and
# rolling.py ingests CHECK_RATE/s more on keys of its own, recording each
# answer per key:
#   every broker in turn: broker.sh term, broker.sh start, broker.sh wait-isr;
#   every node in turn:   SIGTERM, start again, /readyz 200, UP in HAProxy;
# with SETTLE seconds of steady load before, between and after. At the end,
# on every node, the count `n` of each box must be at least the 200s its key
# got (the checker's keys one by one, the generator's summed).
#
# Prints, and writes with the per-slice numbers to
# benches/log/results/<date>-rolling.txt: requests, failed requests and their
# share (goal <= 0.1 %), failures by code (each must be a 503 or a refused
# connection), p99 of ingest and poll in each restart window, and whether any
# acknowledged message was lost.
#
# Knobs: ROLLING_NODES (2), ROLLING_RATE (2000), ROLLING_SLICE_S (2),
# ROLLING_SETTLE_S (8), ROLLING_CHECK_RATE (50), ROLLING_KEYS (1000),
# ROLLING_LB_DRAIN=1 (before a node's SIGTERM, set it to drain in HAProxy and
# wait until it has no request in flight; ready again once it is), ROLLING_KEEP=1
# (keep the work folder), POLLBOX_BIN (else cargo build --release -p pollbox; a
# copy is run), ROLLING_BUILD (what the header says of the build, else from git),
# ROLLING_LOG_CLIENT (`[log.client]` lines for the nodes, e.g.
# '"fetch.wait.max.ms" = "500"'; the results file's name gets -log-client).
# Needs java (scripts/kafka/install-deps.sh), haproxy, python3; ~1.5 GB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
NODES=${ROLLING_NODES:-2}
RATE=${ROLLING_RATE:-2000}
SLICE=${ROLLING_SLICE_S:-2}
SETTLE=${ROLLING_SETTLE_S:-8}
CHECK_RATE=${ROLLING_CHECK_RATE:-50}
KEYS=${ROLLING_KEYS:-1000}
PY="$ROOT/benches/log/rolling.py"
K="$ROOT/scripts/kafka"
RESULTS="$ROOT/benches/log/results"
suffix="${ROLLING_LB_DRAIN:+-lb-drain}${ROLLING_LOG_CLIENT:+-log-client}$([[ "$RATE" == 2000 ]] || echo "-${RATE}rps")"
OUT="$RESULTS/$(date +%F)-rolling$suffix.txt"
LOAD_START="$(cut -d' ' -f1-3 /proc/loadavg)"
WORK="$(mktemp -d /tmp/pollbox-rolling.XXXXXX)"
mkdir -p "$RESULTS" "$WORK/slices"
command -v haproxy >/dev/null || { echo "rolling.sh: haproxy not found (apt-get install -y haproxy)" >&2; exit 1; }

NODE_PIDS=() HAPROXY_PID="" LOADER_PID="" CHECKER_PID=""
MAIN_PID=$BASHPID
cleanup() {
  [[ $BASHPID == "$MAIN_PID" ]] || return 0
  touch "$WORK/stop"
  local p
  for p in "$LOADER_PID" "$CHECKER_PID" "$HAPROXY_PID" "${NODE_PIDS[@]+"${NODE_PIDS[@]}"}"; do
    if [[ -n "$p" ]]; then kill "$p" 2>/dev/null || true; fi
  done
  sleep 1
  if [[ -n "${KAFKA_DIR:-}" ]]; then "$K/stop.sh" "$KAFKA_DIR" >/dev/null 2>&1 || true; fi
  if [[ -z "${ROLLING_KEEP:-}" ]]; then rm -rf "$WORK"; else echo "rolling.sh: kept $WORK" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
say() { printf '%s %s\n' "$(date +%T)" "$*" | tee -a "$WORK/steps.log" >&2; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- the binary -------------------------------------------------------------
if [[ -z "${POLLBOX_BIN:-}" ]]; then
  cargo build --release -q -p pollbox
  POLLBOX_BIN=target/release/pollbox
fi
mkdir -p "$WORK/bin"
cp "$POLLBOX_BIN" "$WORK/bin/pollbox"   # others' builds may replace target/ meanwhile
POLLBOX="$WORK/bin/pollbox"
BUILD_DESC="${ROLLING_BUILD:-}"
[[ -n "$BUILD_DESC" ]] || BUILD_DESC="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates config Cargo.lock 2>/dev/null \
  || echo ' + uncommitted changes in crates/, config/ or Cargo.lock')"

# --- brokers and topic ------------------------------------------------------
say "starting 3 brokers"
t=$(now)
"$K/start.sh" --brokers 3 --partitions 4 --watch-pid $$ --dir "$WORK/kafka" >"$WORK/broker.env"
KAFKA_DIR="$WORK/kafka"
# shellcheck disable=SC1091
. "$WORK/broker.env"
BROKERS_UP_S=$(python3 -c "print(f'{$(now) - $t:.1f}')")
"$K/topic.sh" "$BOOTSTRAP" create pollbox 4 --replication-factor 3 \
  --config min.insync.replicas=2 >/dev/null
"$K/topic.sh" "$BOOTSTRAP" describe pollbox >"$WORK/topic.txt"
broker_rss() { # resident MiB of each broker, now
  local b
  for b in 1 2 3; do
    echo -n "$(($(awk '/^VmRSS:/ {print $2}' "/proc/$("$K/broker.sh" "$KAFKA_DIR" "$b" pid)/status") / 1024)) "
  done
}
RSS_START=$(broker_rss)
say "brokers up in ${BROKERS_UP_S}s: $BOOTSTRAP"

# --- nodes --------------------------------------------------------------------
PORTS=()
start_node() { # I: start node I on its config; its pid in NODE_PIDS[I-1]
  local i=$1
  "$POLLBOX" serve --config "$WORK/node-$i.toml" >>"$WORK/node-$i.log" 2>&1 &
  NODE_PIDS[i - 1]=$!
}
wait_ready() { # URL: until /readyz answers 200 (60 s)
  local deadline=$((SECONDS + 60))
  until [[ "$(curl -s -o /dev/null -w '%{http_code}' "$1/readyz")" == 200 ]]; do
    ((SECONDS < deadline)) || { echo "rolling.sh: $1 not ready after 60 s" >&2; return 1; }
    sleep 0.1
  done
}
for i in $(seq "$NODES"); do
  PORTS+=("$(free_port)")
  cat >"$WORK/node-$i.toml" <<EOF
[server]
listen = "127.0.0.1:${PORTS[i - 1]}"
workers = 1

[snapshot]
path = "$WORK/node-$i.snapshot"
interval_s = 10

[log]
brokers = "$BOOTSTRAP"
topic = "pollbox"
${ROLLING_LOG_CLIENT:+
[log.client]
$ROLLING_LOG_CLIENT}
EOF
  start_node "$i"
done
for i in $(seq "$NODES"); do wait_ready "http://127.0.0.1:${PORTS[i - 1]}"; done
say "$NODES nodes ready on ports ${PORTS[*]}"

# --- HAProxy: the replicas' template, a stats socket added, one server per node -
FRONT=$(free_port)
{
  sed '/^backend pollbox/,$ { /^    server node[0-9]/d }' deploy/haproxy/haproxy-replicas.cfg.tmpl \
    | sed "s#^    zero-warning#    zero-warning\n    stats socket $WORK/haproxy.sock mode 600 level admin#"
  for i in $(seq "$NODES"); do echo "    server node$i \"127.0.0.1:${PORTS[i - 1]}\""; done
} >"$WORK/haproxy.cfg"
FRONT_PORT=$FRONT haproxy -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
HAPROXY_PID=$!
wait_up() { # SERVER: until HAProxy has it UP (60 s)
  local deadline=$((SECONDS + 60))
  until python3 "$PY" haproxy-up "$WORK/haproxy.sock" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "rolling.sh: HAProxy has not put $1 UP after 60 s" >&2; return 1; }
    sleep 0.2
  done
}
for i in $(seq "$NODES"); do wait_up "node$i"; done
URL="http://127.0.0.1:$FRONT"
say "HAProxy on $URL, every node UP"

# --- load ---------------------------------------------------------------------
# Back-to-back generator runs of SLICE s each, launched on a fixed schedule (a
# run still draining its last answers overlaps the next), so the per-window
# figures below come from whole runs. One request in 2001 is a long-poll of
# 5 s: it makes each run wait 7 s (2 s + the wait) for its last answers, more
# than log.ack_timeout_ms, so an ingest still waiting for the log when its run
# ends is counted with its answer, not as unanswered.
slicer() {
  local k=0 t0 next
  t0=$(now)
  while [[ ! -e "$WORK/stop" ]]; do
    next=$(python3 -c "print($t0 + $k * $SLICE)")
    python3 -c "import time; time.sleep(max(0, $next - time.time()))"
    [[ -e "$WORK/stop" ]] && break
    echo "$k $(now)" >>"$WORK/slices/starts"
    "$POLLBOX" load --url "$URL" --rate "$RATE" --mix ingest:1000,poll:1000,longpoll:1 \
      --longpoll-wait 5s --keys "$KEYS" \
      --connections 32 --duration "${SLICE}s" --seed "$((k + 1))" --max-error-rate 1 --quiet \
      --json "$WORK/slices/$k.json" --hgrm "$WORK/slices/$k.hgrm" >"$WORK/slices/$k.out" 2>&1 &
    k=$((k + 1))
  done
  wait
}
slicer &
LOADER_PID=$!
python3 "$PY" ingest "$URL" "$CHECK_RATE" 100 "$WORK/checker.json" "$WORK/stop" &
CHECKER_PID=$!
say "load on: $RATE req/s (half ingest, half poll) in ${SLICE}s slices, checker $CHECK_RATE ingests/s"

: >"$WORK/windows.tsv"
window() { printf '%s\t%s\t%s\n' "$1" "$2" "$(now)" >>"$WORK/windows.tsv"; }
t=$(now)
# Who uses the CPU in steady state (this machine may be shared).
sleep "$((SETTLE / 2))"
top -b -c -n 2 -d 2 -w 160 | awk '/^top -/ { n++ } n == 2' | head -n 22 >"$WORK/ps-steady.txt" || true
sleep "$((SETTLE - SETTLE / 2))"
window "steady before" "$t"

for b in 1 2 3; do
  t=$(now)
  say "broker $b: term"
  "$K/broker.sh" "$KAFKA_DIR" "$b" term
  say "broker $b: start"
  "$K/broker.sh" "$KAFKA_DIR" "$b" start
  say "broker $b: wait-isr"
  "$K/broker.sh" "$KAFKA_DIR" "$b" wait-isr pollbox
  window "broker $b" "$t"
  say "broker $b: back, ISR full"
  t=$(now); sleep "$SETTLE"; window "steady after broker $b" "$t"
done

for i in $(seq "$NODES"); do
  t=$(now)
  if [[ -n "${ROLLING_LB_DRAIN:-}" ]]; then
    say "node $i: drain in HAProxy"
    python3 "$PY" haproxy "$WORK/haproxy.sock" "set server pollbox/node$i state drain" >/dev/null
    deadline=$((SECONDS + 10))
    until python3 "$PY" haproxy-idle "$WORK/haproxy.sock" "node$i" || ((SECONDS >= deadline)); do sleep 0.1; done
  fi
  curl -s "http://127.0.0.1:${PORTS[i - 1]}/metrics" >"$WORK/metrics-node$i-before-sigterm.txt" || true
  say "node $i: SIGTERM"
  kill -TERM "${NODE_PIDS[i - 1]}"
  wait "${NODE_PIDS[i - 1]}" || say "node $i exited with $?"
  say "node $i: start"
  start_node "$i"
  wait_ready "http://127.0.0.1:${PORTS[i - 1]}"
  say "node $i: ready"
  if [[ -n "${ROLLING_LB_DRAIN:-}" ]]; then
    python3 "$PY" haproxy "$WORK/haproxy.sock" "set server pollbox/node$i state ready" >/dev/null
  fi
  wait_up "node$i"
  window "node $i" "$t"
  say "node $i: UP in HAProxy"
  t=$(now); sleep "$SETTLE"; window "steady after node $i" "$t"
done

touch "$WORK/stop"
wait "$CHECKER_PID" || true
CHECKER_PID=""
wait "$LOADER_PID" || true
LOADER_PID=""
say "load off; verifying every node"
sleep 3   # let every node apply the last records
NODE_URLS=()
for i in $(seq "$NODES"); do NODE_URLS+=("http://127.0.0.1:${PORTS[i - 1]}"); done
for i in $(seq "$NODES"); do
  curl -s "http://127.0.0.1:${PORTS[i - 1]}/metrics" >"$WORK/metrics-node$i-at-the-end.txt" || true
done
python3 "$PY" verify "$WORK/verify.json" "$WORK/checker.json" "$WORK/slices" "$KEYS" "${NODE_URLS[@]}" >/dev/null

RSS_END=$(broker_rss)
{
  echo "# benches/log/rolling.sh, ended $(date -u +%FT%TZ), build $BUILD_DESC"
  echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "# 3 brokers (Kafka $(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$K/pom.xml"), up in ${BROKERS_UP_S} s," \
    "resident MiB each: ${RSS_START}at start, ${RSS_END}at the end), $NODES nodes (workers = 1), HAProxy $(haproxy -v | head -1 | awk '{print $3}')"
  echo "# load: $RATE req/s open-loop (ingest:1000,poll:1000,longpoll:1, $KEYS keys, 512-byte messages, 32 connections) in ${SLICE}-s slices;" \
    "checker: $CHECK_RATE ingests/s on 100 keys of its own; ${SETTLE} s steady between restarts;" \
    "nodes: ${ROLLING_LB_DRAIN:+drained in HAProxy, then }SIGTERM"
  echo "# load average at start: $LOAD_START; at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# log.client: ${ROLLING_LOG_CLIENT:-none: the defaults}"
  echo
  echo "== the busiest processes in the first steady window (top, over 2 s) =="
  cat "$WORK/ps-steady.txt"
  echo
  echo "== topic =="
  cat "$WORK/topic.txt"
  echo
  echo "== steps =="
  cat "$WORK/steps.log"
  echo
  SLICE=$SLICE python3 "$PY" report "$WORK/windows.tsv" "$WORK/slices" "$WORK/verify.json" "$WORK/haproxy.log"
  echo
  echo "== checker answers =="
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['answers'])" "$WORK/checker.json"
  echo "answers other than 200 (time, key, answer, body):"
  python3 -c "
import json, sys, time
for t, k, o, b in json.load(open(sys.argv[1])).get('odd', []):
    print(' ', time.strftime('%H:%M:%S', time.localtime(t)) + f'.{int(t * 1000) % 1000:03d}', k, o, b.strip()[:80])
" "$WORK/checker.json"
  echo
  echo "== each node's counters of ingest, refusals and the log, before its SIGTERM and at the end =="
  for f in "$WORK"/metrics-*.txt; do
    [[ -e "$f" ]] || continue
    echo "-- $(basename "$f" .txt)"
    grep -E '^pollbox_(ingest_messages|connections_rejected|log_produce|log_records|log_consume|http_requests_total\{[^}]*code="5)' "$f" | grep -v ' 0$' || true
  done
  echo
  echo "== node logs (all lines) =="
  for i in $(seq "$NODES"); do sed "s/^/node $i: /" "$WORK/node-$i.log"; done
} >"$OUT"
sed -n '/^== summary ==/,/^== checker answers ==/p' "$OUT" | sed '$d'
echo "raw output: $OUT"
