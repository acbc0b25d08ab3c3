#!/usr/bin/env bash
# Batch ingest through the log beside standalone and beside the floor, all on
# the same broker in the same run, alternated:
#  - standalone: a node without a log under `pollbox load --mix batch:100`;
#  - log: the same load on a node of a log (one topic of 4 partitions);
#  - floor: `logbench batch`, a producer and a consumer set as pollbox's in
#    one process, batches of the same size, as many in flight as connections:
#    one rd_kafka_produce_batch a partition, a batch done when all its
#    records are read back and acknowledged (every delivery report, served
#    by a thread of its own), as pollbox's node does;
#  - producer: `logbench fill`, a bare librdkafka producer (acks=all,
#    idempotent, batched with linger 5 ms): what the broker takes.
# Reports messages (records)/s, node (client) CPU per message, the broker's
# CPU per message, the answer's (the batch's) p50/p99, then the medians and
# the ratios of the goals (BENCHMARKS.md, "The Kafka log").
# Each node: one worker, on LOG_NODE_CPU; the generator with the broker.
#
#   benches/log/batch.sh             # results/DATE-batch.txt
#
# Knobs: BATCH_SIZE (100), BATCH_CONNECTIONS (16), BATCH_DURATION (8 s),
# BATCH_REPS (3), BATCH_FILL_RECORDS (1500000), BATCH_TAG (results/DATE-batch-TAG.txt);
# lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
SIZE=${BATCH_SIZE:-100}
CONNS=${BATCH_CONNECTIONS:-16}
DUR=${BATCH_DURATION:-8}
REPS=${BATCH_REPS:-3}
FILL=${BATCH_FILL_RECORDS:-1500000}
OUT=$RESULTS/$(date -u +%F)-batch${BATCH_TAG:+-$BATCH_TAG}.txt
build
broker_up
quiet
header "$OUT" "BATCH_SIZE=$SIZE BATCH_CONNECTIONS=$CONNS BATCH_DURATION=$DUR BATCH_REPS=$REPS BATCH_FILL_RECORDS=$FILL benches/log/batch.sh"
LOAD_ARGS=(--mix batch:100 --batch-size "$SIZE" --body-bytes 512 --keys 10000 -c "$CONNS" --pipeline 1)
echo "# pollbox load ${LOAD_ARGS[*]} --warmup 2s -d ${DUR}s; logbench batch --batch $SIZE --inflight $CONNS --seconds $DUR; logbench fill --records $FILL" | tee -a "$OUT"

TOPIC=batch-$$
topic_create "$TOPIC" 4
topic_create "$TOPIC-floor" 4
topic_create "$TOPIC-fill" 4
node_up standalone 19211
declare -A PID_OF=([standalone]=$NODE_PID)
node_up log 19212 "$TOPIC"
PID_OF[log]=$NODE_PID
wait_ready 19212 60
declare -A PORT_OF=([standalone]=19211 [log]=19212)

# load NAME REP: one `pollbox load` run; prints its line.
load() {
  local name=$1 rep=$2
  local port=${PORT_OF[$name]} pid=${PID_OF[$name]} t0 t1 b0 b1
  local json=$WORK/$name-$rep.json
  t0=$(ticks "$pid"); b0=$(ticks "$BROKER_PID")
  "$POLLBOX" load --url "http://127.0.0.1:$port" "${LOAD_ARGS[@]}" --warmup 2s -d "${DUR}s" \
    --json "$json" -q >"$WORK/load.txt" 2>&1 || { echo "load failed:"; cat "$WORK/load.txt"; }
  t1=$(ticks "$pid"); b1=$(ticks "$BROKER_PID")
  # The warm-up's 2 s are in the CPU ticks too: per message over both.
  python3 - "$json" "$name" "$rep" "$((t1 - t0))" "$((b1 - b0))" "$HZ" "$DUR" <<'PY'
import json, sys
path, name, rep, t, b, hz, dur = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]
msgs = r["messages_per_s"] * (float(dur) + (r.get("warmup_s", 0) or 0))
cpu = int(t) / int(hz) * 1e6 / max(msgs, 1); bcpu = int(b) / int(hz) * 1e6 / max(msgs, 1)
print(f"{name:10s} rep {rep}  {r['messages_per_s']:9,.0f} msg/s  p50 {l['p50']:.3f}  p99 {l['p99']:.3f} ms  "
      f"errors {r['errors_total']}  node CPU {cpu:.2f} us/msg  broker CPU {bcpu:.2f} us/msg")
PY
}

floor() { # REP
  local f b0 b1
  b0=$(ticks "$BROKER_PID")
  f=$(taskset -c "$NODE_CPU" "$LOGBENCH" batch --brokers "$BOOTSTRAP" --topic "$TOPIC-floor" \
    --batch "$SIZE" --inflight "$CONNS" --seconds "$DUR")
  b1=$(ticks "$BROKER_PID")
  python3 - "$f" "$1" "$((b1 - b0))" "$HZ" <<'PY'
import json, sys
f = json.loads(sys.argv[1]); rep, b, hz = sys.argv[2:]
# The broker's ticks include the client's start and warm-up: a little high.
bcpu = int(b) / int(hz) * 1e6 / max(f["records"], 1)
print(f"{'floor':10s} rep {rep}  {f['records_per_s']:9,.0f} msg/s  p50 {f['p50_us']/1e3:.3f}  p99 {f['p99_us']/1e3:.3f} ms  "
      f"errors {f['failed']}  node CPU {f['cpu_us_per_record']:.2f} us/msg  broker CPU {bcpu:.2f} us/msg")
PY
}

producer() { # REP
  local f b0 b1
  b0=$(ticks "$BROKER_PID")
  f=$(taskset -c "$NODE_CPU" "$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$TOPIC-fill" --records "$FILL")
  b1=$(ticks "$BROKER_PID")
  python3 - "$f" "$1" "$((b1 - b0))" "$HZ" <<'PY'
import json, sys
f = json.loads(sys.argv[1]); rep, b, hz = sys.argv[2:]
n = f["records"]
print(f"{'producer':10s} rep {rep}  {f['records_per_s']:9,.0f} msg/s  p50 nan  p99 nan ms  errors {f['failed']}  "
      f"node CPU {(f['cpu_user_s'] + f['cpu_sys_s']) * 1e6 / n:.2f} us/msg  broker CPU {int(b) / int(hz) * 1e6 / n:.2f} us/msg")
PY
}

# A fresh broker's JIT: a run through the log, left out.
DUR=6 load log warm-up >/dev/null
{
  for rep in $(seq 1 "$REPS"); do
    load standalone "$rep"
    load log "$rep"
    floor "$rep"
    producer "$rep"
  done
} >"$WORK/lines"
tee -a "$OUT" <"$WORK/lines"

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+rep \d+\s+([\d,]+) msg/s\s+p50 (\S+)\s+p99 (\S+) ms.*node CPU ([\d.]+) us/msg\s+broker CPU ([\d.]+)", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[2].replace(",", ""))] + [float(m[i]) for i in range(3, 7)])
med = {k: [st.median(c) for c in zip(*v)] for k, v in rows.items()}
print("# medians: msg/s, answer p50 / p99 ms, node (client) and broker CPU us/msg")
for k, m in med.items():
    print(f"median {k:10s} {m[0]:9,.0f} msg/s  {m[1]:.3f} / {m[2]:.3f} ms  node {m[3]:.2f}  broker {m[4]:.2f} us/msg  ({len(rows[k])} runs)")
log, sa, fl, pr = med["log"], med["standalone"], med["floor"], med["producer"]
print(f"# log / bare producer records/s: {log[0] / pr[0]:.2f} (goal >= 0.8); log / floor: {log[0] / fl[0]:.2f}; log / standalone: {log[0] / sa[0]:.2f}")
print(f"# node CPU per message: log {log[3]:.2f} us = {log[3] / (fl[3] + sa[3]):.2f}x (floor {fl[3]:.2f} + standalone {sa[3]:.2f}) (goal <= 1.5x)")
PY
echo "# raw: $OUT"
