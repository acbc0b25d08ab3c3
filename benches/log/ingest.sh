#!/usr/bin/env bash
# Single-message ingest through the log against a standalone node, beside the
# log's own produce→consume floor on the same broker.
#  - open loop: `pollbox load --mix ingest:100` at INGEST_RATE and FLOOR_RATE
#    over INGEST_CONNECTIONS, answer latency p50/p99/p99.9 (corrected for
#    coordinated omission), standalone and log node alternated;
#  - the floor: `logbench floor` (a producer set as pollbox's, a consumer set as
#    pollbox's reading every partition from its end) at FLOOR_RATE and at
#    INGEST_RATE, in the same rounds, each for INGEST_DURATION;
#  - closed loop over INGEST_CLOSED_CONNECTIONS: messages/s, and the node's and
#    the broker's CPU per message.
# Each node: one worker, on LOG_NODE_CPU; the generator with the broker.
#
#   benches/log/ingest.sh            # results/DATE-ingest.txt
#
# Knobs: INGEST_RATE (2000), INGEST_CONNECTIONS (16), INGEST_CLOSED_CONNECTIONS
# (64), INGEST_DURATION (10 s), INGEST_REPS (3), INGEST_KEYS (1000),
# FLOOR_RATE (500); lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
RATE=${INGEST_RATE:-2000}
CONNS=${INGEST_CONNECTIONS:-16}
CCONNS=${INGEST_CLOSED_CONNECTIONS:-64}
DUR=${INGEST_DURATION:-10}
REPS=${INGEST_REPS:-3}
KEYS=${INGEST_KEYS:-1000}
FRATE=${FLOOR_RATE:-500}
OUT=$RESULTS/$(date -u +%F)-ingest.txt
build
broker_up
quiet
header "$OUT" "INGEST_RATE=$RATE INGEST_CONNECTIONS=$CONNS INGEST_CLOSED_CONNECTIONS=$CCONNS INGEST_DURATION=$DUR INGEST_REPS=$REPS FLOOR_RATE=$FRATE benches/log/ingest.sh"
echo "# pollbox load --mix ingest:100 --body-bytes 512 --keys $KEYS --warmup 2s -d ${DUR}s; open loop: -c $CONNS --rate $RATE and --rate $FRATE; closed loop: -c $CCONNS" | tee -a "$OUT"

TOPIC=ingest-$$
topic_create "$TOPIC" 4
node_up standalone 19201
declare -A PID_OF=([standalone]=$NODE_PID)
node_up log 19202 "$TOPIC"
PID_OF[log]=$NODE_PID
wait_ready 19202 60
declare -A PORT_OF=([standalone]=19201 [log]=19202)

# load NAME MODE REP ARGS...: one `pollbox load` run; prints its line.
load() {
  local name=$1 mode=$2 rep=$3; shift 3
  local port=${PORT_OF[$name]} pid=${PID_OF[$name]} t0 t1 b0 b1
  local json=$WORK/$name-$mode-$rep.json
  t0=$(ticks "$pid"); b0=$(ticks "$BROKER_PID")
  "$POLLBOX" load --url "http://127.0.0.1:$port" --mix ingest:100 --body-bytes 512 \
    --keys "$KEYS" --warmup 2s -d "${DUR}s" --json "$json" -q "$@" >"$WORK/load.txt" 2>&1 \
    || { echo "load failed:"; cat "$WORK/load.txt"; }
  t1=$(ticks "$pid"); b1=$(ticks "$BROKER_PID")
  # The warm-up's 2 s are in the CPU ticks too: per message over both.
  python3 - "$json" "$name" "$mode" "$rep" "$((t1 - t0))" "$((b1 - b0))" "$HZ" "$DUR" <<'PY'
import json, sys
path, name, mode, rep, t, b, hz, dur = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]
w = r.get("warmup_s", 0) or 0
msgs = r["messages_per_s"] * (float(dur) + w)
cpu = int(t) / int(hz) * 1e6 / max(msgs, 1); bcpu = int(b) / int(hz) * 1e6 / max(msgs, 1)
print(f"{mode:9s} {name:10s} rep {rep}  {r['messages_per_s']:9,.0f} msg/s  p50 {l['p50']:.3f}  p99 {l['p99']:.3f}  p99.9 {l['p999']:.3f}  max {l['max']:.3f} ms  "
      f"errors {r['errors_total']}  node CPU {cpu:.1f} us/msg  broker CPU {bcpu:.1f} us/msg")
PY
}

floor() { # RATE REP
  local f
  f=$(taskset -c "$NODE_CPU" "$LOGBENCH" floor --brokers "$BOOTSTRAP" --topic "$TOPIC" --count $(($1 * DUR)) --rate "$1" --keys "$KEYS")
  python3 - "$f" "$1" "$2" <<'PY'
import json, sys
f = json.loads(sys.argv[1]); rate, rep = sys.argv[2:]
print(f"floor  at {rate:>5s}/s  rep {rep}  received {f['received']}/{f['sent']}  p50 {f['p50_us']/1e3:.3f}  p99 {f['p99_us']/1e3:.3f}  p99.9 {f['p999_us']/1e3:.3f}  max {f['max_us']/1e3:.3f} ms  client CPU {f.get('cpu_us_per_msg', float('nan')):.1f} us/msg")
PY
}

# A fresh broker's JIT: 10 s of ingest through the log, left out.
DUR=10 load log warm-up 0 -c "$CONNS" --rate "$RATE" >/dev/null
{
  for rep in $(seq 1 "$REPS"); do
    load standalone open "$rep" -c "$CONNS" --rate "$RATE"
    load log open "$rep" -c "$CONNS" --rate "$RATE"
    floor "$RATE" "$rep"
    load standalone open@"$FRATE" "$rep" -c "$CONNS" --rate "$FRATE"
    load log open@"$FRATE" "$rep" -c "$CONNS" --rate "$FRATE"
    floor "$FRATE" "$rep"
  done
  for rep in $(seq 1 "$REPS"); do
    load standalone closed "$rep" -c "$CCONNS"
    load log closed "$rep" -c "$CCONNS"
  done
} >"$WORK/lines"
tee -a "$OUT" <"$WORK/lines"

python3 - "$OUT" "$FRATE" "$RATE" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
out, frate, rate = sys.argv[1:]
rows = {}
for line in open(out):
    m = re.match(r"(open\S*|closed)\s+(\S+)\s+rep \d+\s+([\d,]+) msg/s\s+p50 ([\d.]+)\s+p99 ([\d.]+)\s+p99.9 ([\d.]+).*node CPU ([\d.]+) us/msg\s+broker CPU ([\d.]+)", line)
    if m:
        rows.setdefault((m[1], m[2]), []).append([float(m[3].replace(",", ""))] + [float(m[i]) for i in range(4, 9)])
        continue
    m = re.match(r"floor\s+at\s+(\d+)/s.*p50 ([\d.]+)\s+p99 ([\d.]+)\s+p99.9 ([\d.]+)", line)
    if m:
        c = re.search(r"client CPU ([\d.]+)", line)
        rows.setdefault(("floor", m[1] + "/s"), []).append([float("nan")] + [float(m[i]) for i in (2, 3, 4)] + [float(c[1]) if c else float("nan"), float("nan")])
print("# medians: msg/s, p50 / p99 / p99.9 ms, node and broker CPU us/msg")
for (mode, name), rs in rows.items():
    med = [st.median(c) for c in zip(*rs)]
    print(f"median {mode:9s} {name:10s} {med[0]:9,.0f} msg/s  {med[1]:.3f} / {med[2]:.3f} / {med[3]:.3f} ms  node {med[4]:.1f}  broker {med[5]:.1f} us/msg  ({len(rs)} runs)")
for fr, mode in ((rate, "open"), (frate, "open@" + frate)):
    lp = st.median(r[2] for r in rows[(mode, "log")])
    fp = st.median(r[2] for r in rows[("floor", fr + "/s")])
    print(f"# at {fr}/s: the log node's p99 minus the floor's p99: {lp - fp:+.3f} ms (goal: within 1 ms)")
    sc = st.median(r[4] for r in rows[(mode, "standalone")])
    lc = st.median(r[4] for r in rows[(mode, "log")])
    fc = st.median(r[4] for r in rows[("floor", fr + "/s")])
    print(f"# at {fr}/s: node CPU per message, log {lc:.1f} us = {lc / sc:.2f}x standalone's {sc:.1f} us (goal <= 1.5x); the client floor alone {fc:.1f} us = {fc / sc:.2f}x")
PY
echo "# raw: $OUT"
