#!/usr/bin/env bash
# pollbox with the write-ahead file beside Redis (appendfsync always) and NATS
# JetStream (sync_interval: always) on the same disk, the same work: 512 B
# messages, each acknowledged only once it is on disk (fdatasync/fsync before the
# answer). Each server on SERVER_CPU (all its threads), its client on LOAD_CPU;
# alternated round by round. Two shapes of load:
#  - "batched": pollbox POST /v1/ingest of 100 messages over 16 connections;
#    redis-benchmark SET -c 16 -P 100 (16 connections, 100 pipelined);
#    nats bench js pub async --clients 16 --batch 100 (16 connections, 100
#    publishes in flight, each PubAck awaited);
#  - "many": 1,000 connections each sending one message at a time: pollbox POST
#    /v1/boxes/{key} -c 1000; redis-benchmark -c 1000 -P 1; nats bench js pub
#    sync --clients 1000 (each publish waits its PubAck).
# Each line: messages/s, the server's CPU (utime + stime from /proc/PID/stat over
# the run) per message and so messages/s per core of server CPU. Messages counted
# by the server: pollbox_ingest_messages_total, Redis INFO total_commands_processed,
# the stream's message count (nats stream info).
#
#   benches/wal/peers.sh            # results/DATE-peers.txt
#
# Needs redis-server and redis-benchmark (Debian: apt-get install redis-server
# redis-tools), nats-server and nats (GOBIN=$HOME/go/bin go install
# github.com/nats-io/nats-server/v2@v2.15.2 and github.com/nats-io/natscli/nats@v0.5.0);
# a peer that is missing is reported and skipped.
# With PEERS_BASELINES=1 each server also runs without its durability, beside it
# in the same rounds: pollbox with snapshots only (no [wal]), Redis with
# appendonly no, NATS into a memory stream of the same server. The summary then
# gives each server's own cost of syncing before the answer (durable / not), the
# state of the art for the write-ahead file's goal of 0.8x.
# Knobs: PEERS_REPS (3), PEERS_DURATION (8 s), PEERS_KINDS ("batched many"),
# PEERS_BASELINES (0), WAL_TAG; lib.sh's WAL_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
REPS=${PEERS_REPS:-3}
DUR=${PEERS_DURATION:-8}
KINDS=${PEERS_KINDS:-batched many}
BASELINES=${PEERS_BASELINES:-0}
OUT=$RESULTS/$(date -u +%F)-peers${WAL_TAG:+-$WAL_TAG}.txt
PATH=$PATH:$HOME/go/bin
build
header "$OUT" "PEERS_REPS=$REPS PEERS_DURATION=$DUR PEERS_KINDS='$KINDS' PEERS_BASELINES=$BASELINES benches/wal/peers.sh"

# pollbox: the write-ahead file, a snapshot every 10 s.
node_up pollbox 19331 wal
POLLBOX_PID=$NODE_PID
wait_ready 19331 pollbox 60
echo "# pollbox: $("$POLLBOX" --version 2>/dev/null || echo "build $BUILD_DESC"); [wal] default segment_bytes, snapshot.interval_s 10, --workers 1" | tee -a "$OUT"
PLAIN_PID=""
if [[ $BASELINES == 1 ]]; then
  node_up plain 19334 snapshots
  PLAIN_PID=$NODE_PID
  wait_ready 19334 plain 60
  echo "# pollbox-plain: the same build, snapshots only (no [wal]), port 19334" | tee -a "$OUT"
fi

# Redis: every write fsynced before its reply (appendfsync always), no RDB, no AOF rewrite.
redis_up() { # PORT DIR ARGS...: sets REDIS_UP_PID
  local port=$1 dir=$2; shift 2
  mkdir -p "$dir"
  taskset -c "$SERVER_CPU" redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" "$@" \
    --save '' --daemonize no --logfile "$dir/redis.log" &
  REDIS_UP_PID=$!
  STARTED_PIDS+=("$REDIS_UP_PID")
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
}
REDIS_PID=""; REDIS_PLAIN_PID=""
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
  redis_up 19332 "$WORK/redis" --appendonly yes --appendfsync always --auto-aof-rewrite-percentage 0
  REDIS_PID=$REDIS_UP_PID
  echo "# redis: $(redis-server --version); appendonly yes, appendfsync always, save '', auto-aof-rewrite-percentage 0" | tee -a "$OUT"
  if [[ $BASELINES == 1 ]]; then
    redis_up 19335 "$WORK/redis-plain" --appendonly no
    REDIS_PLAIN_PID=$REDIS_UP_PID
    echo "# redis-plain: appendonly no, save '' (memory only), port 19335" | tee -a "$OUT"
  fi
else
  echo "# redis: not installed ($(command -v redis-server || echo 'redis-server: command not found'))" | tee -a "$OUT"
fi

# NATS JetStream: one file stream, every write synced (sync_interval: always).
NATS_PID=""
if command -v nats-server >/dev/null && command -v nats >/dev/null; then
  mkdir -p "$WORK/nats"
  cat >"$WORK/nats.conf" <<EOF
listen: 127.0.0.1:19333
max_payload: 1MB
jetstream {
  store_dir: "$WORK/nats"
  sync_interval: always
}
EOF
  taskset -c "$SERVER_CPU" nats-server -c "$WORK/nats.conf" >"$WORK/nats.log" 2>&1 &
  NATS_PID=$!
  STARTED_PIDS+=("$NATS_PID")
  export NATS_URL=nats://127.0.0.1:19333
  for _ in $(seq 100); do nats server check connection >/dev/null 2>&1 && break; sleep 0.05; done
  nats stream add walbench --subjects 'walbench.>' --storage file --replicas 1 --defaults >/dev/null
  echo "# nats: $(nats-server --version); sync_interval: always; stream walbench (file, R1); client $(nats --version 2>&1)" | tee -a "$OUT"
  if [[ $BASELINES == 1 ]]; then
    nats stream add walmem --subjects 'walmem.>' --storage memory --replicas 1 --defaults >/dev/null
    echo "# nats-plain: stream walmem (memory, R1) on the same server" | tee -a "$OUT"
  fi
else
  echo "# nats: not installed ($(command -v nats-server || echo 'nats-server: command not found'); $(command -v nats || echo 'nats: command not found'))" | tee -a "$OUT"
fi

line() { # NAME REP MSGS SECONDS TICKS [NOTE]
  python3 - "$@" "$HZ" <<'PY'
import sys
name, rep, msgs, secs, ticks = sys.argv[1:6]; note = sys.argv[6] if len(sys.argv) > 7 else ""; hz = sys.argv[-1]
msgs, secs, cpu = float(msgs), float(secs), int(ticks) / int(hz)
us = cpu * 1e6 / max(msgs, 1)
print(f"{name:16s} rep {rep}  {msgs / secs:10,.0f} msg/s  server CPU {us:.2f} us/msg = {1e6 / us if us else 0:10,.0f} msg/s per core  "
      f"({cpu:.2f} s over {msgs:,.0f} msgs in {secs:.2f} s) {note}")
PY
}

pollbox_run() { # NAME PORT PID KIND REP
  local name=$1 port=$2 pid=$3 kind=$4 args t0 t1 m0 m1 w0 w1
  [[ -n "$pid" ]] || return 0
  if [[ $kind == batched ]]; then args=(--mix batch:100 --batch-size 100 -c 16); else args=(--mix ingest:100 -c 1000); fi
  t0=$(ticks "$pid"); m0=$(metric "$port" pollbox_ingest_messages_total); w0=$(now)
  taskset -c "$LOAD_CPU" "$POLLBOX" load --url "http://127.0.0.1:$port" "${args[@]}" --body-bytes 512 --keys 10000 \
    -d "${DUR}s" -q --json "$WORK/p.json" >"$WORK/load.txt" 2>&1 || { echo "# load failed:"; sed 's/^/#   /' "$WORK/load.txt"; }
  t1=$(ticks "$pid"); m1=$(metric "$port" pollbox_ingest_messages_total); w1=$(now)
  line "$name-$kind" "$5" "$(python3 -c "print($m1 - $m0)")" "$(python3 -c "print($w1 - $w0)")" "$((t1 - t0))" \
    "errors $(python3 -c "import json; print(json.load(open('$WORK/p.json'))['errors_total'])")"
}

declare -A REDIS_N_OF=()
redis_run() { # NAME PORT PID KIND REP
  local name=$1 port=$2 pid=$3 kind=$4 args t0 t1 c0 c1 w0 w1 n
  [[ -n "$pid" ]] || return 0
  if [[ $kind == batched ]]; then args=(-c 16 -P 100); else args=(-c 1000 -P 1); fi
  n=${REDIS_N_OF[$name-$kind]:-}
  if [[ -z "$n" ]]; then # size the run from a short one
    w0=$(now)
    taskset -c "$LOAD_CPU" redis-benchmark -p "$port" -t set -d 512 -r 10000 "${args[@]}" -n 20000 -q >/dev/null 2>&1
    w1=$(now)
    n=$(python3 -c "print(max(20000, int(20000 / ($w1 - $w0) * $DUR)))")
    REDIS_N_OF[$name-$kind]=$n
  fi
  c0=$(redis-cli -p "$port" info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p')
  t0=$(ticks "$pid"); w0=$(now)
  taskset -c "$LOAD_CPU" redis-benchmark -p "$port" -t set -d 512 -r 10000 "${args[@]}" -n "$n" -q 2>&1 \
    | tr '\r' '\n' | grep 'requests per second' | tail -1 >"$WORK/redis.txt" || true
  t1=$(ticks "$pid"); w1=$(now)
  c1=$(redis-cli -p "$port" info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p')
  # The INFO call itself is one command.
  line "$name-$kind" "$5" "$((c1 - c0 - 1))" "$(python3 -c "print($w1 - $w0)")" "$((t1 - t0))" \
    "(redis-benchmark: $(tr -s ' ' <"$WORK/redis.txt"))"
}

nats_msgs() { nats stream info "$1" -j | python3 -c "import json, sys; print(json.load(sys.stdin)['state']['messages'])"; }
declare -A NATS_N_OF=()
nats_run() { # NAME STREAM KIND REP
  local name=$1 stream=$2 kind=$3 args t0 t1 c0 c1 w0 w1 n
  [[ -n "$NATS_PID" ]] || return 0
  if [[ $kind == batched ]]; then args=(async "$stream.x" --clients 16 --batch 100); else args=(sync "$stream.x" --clients 1000); fi
  n=${NATS_N_OF[$name-$kind]:-}
  if [[ -z "$n" ]]; then
    w0=$(now)
    taskset -c "$LOAD_CPU" nats bench js pub "${args[@]}" --stream "$stream" --size 512 --msgs 4000 \
      --no-progress >"$WORK/nats-bench.txt" 2>&1 || { echo "# nats bench failed:"; sed 's/^/#   /' "$WORK/nats-bench.txt"; return 0; }
    w1=$(now)
    n=$(python3 -c "print(max(2000, int(4000 / ($w1 - $w0) * $DUR)))")
    NATS_N_OF[$name-$kind]=$n
  fi
  c0=$(nats_msgs "$stream"); t0=$(ticks "$NATS_PID"); w0=$(now)
  taskset -c "$LOAD_CPU" nats bench js pub "${args[@]}" --stream "$stream" --size 512 --msgs "$n" \
    --no-progress >"$WORK/nats-bench.txt" 2>&1 || { echo "# nats bench failed:"; sed 's/^/#   /' "$WORK/nats-bench.txt"; }
  t1=$(ticks "$NATS_PID"); w1=$(now)
  c1=$(nats_msgs "$stream")
  line "$name-$kind" "$4" "$((c1 - c0))" "$(python3 -c "print($w1 - $w0)")" "$((t1 - t0))" \
    "(nats bench: $(grep -m1 -i 'msgs/sec' "$WORK/nats-bench.txt" | tr -s ' '))"
}

for rep in $(seq 1 "$REPS"); do
  {
    for kind in $KINDS; do
      pollbox_run pollbox 19331 "$POLLBOX_PID" "$kind" "$rep"
      pollbox_run pollbox-plain 19334 "$PLAIN_PID" "$kind" "$rep"
      redis_run redis 19332 "$REDIS_PID" "$kind" "$rep"
      redis_run redis-plain 19335 "$REDIS_PLAIN_PID" "$kind" "$rep"
      nats_run nats walbench "$kind" "$rep"
      [[ $BASELINES != 1 ]] || nats_run nats-plain walmem "$kind" "$rep"
    done
    contention
  } | tee -a "$OUT"
done

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+rep \d+\s+([\d,]+) msg/s\s+server CPU ([\d.]+) us/msg", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[2].replace(",", "")), float(m[3])])
med = {k: [st.median(c) for c in zip(*v)] for k, v in rows.items()}
print("# medians: msg/s; server CPU us/msg; msg/s per core of server CPU")
for k, m in med.items():
    print(f"median {k:16s} {m[0]:10,.0f} msg/s  {m[1]:.2f} us/msg  {1e6 / m[1]:10,.0f} msg/s per core  ({len(rows[k])} runs)")
for kind in ("batched", "many"):
    p = med.get(f"pollbox-{kind}")
    if not p:
        continue
    for peer in ("redis", "nats"):
        q = med.get(f"{peer}-{kind}")
        if q:
            print(f"# {kind}: pollbox / {peer}: msg/s per core of server CPU {q[1] / p[1]:.2f}x, msg/s {p[0] / q[0]:.2f}x")
print("# each server durable against itself without syncing (PEERS_BASELINES=1): msg/s; msg/s per core of server CPU")
for kind in ("batched", "many"):
    for peer in ("pollbox", "redis", "nats"):
        d, n = med.get(f"{peer}-{kind}"), med.get(f"{peer}-plain-{kind}")
        if d and n:
            print(f"# {kind}: {peer} durable / {peer}-plain: msg/s {d[0] / n[0]:.2f}x, msg/s per core {n[1] / d[1]:.2f}x")
PY
echo "# raw: $OUT"
