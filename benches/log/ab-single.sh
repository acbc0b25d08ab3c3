#!/usr/bin/env bash
# Single-message ingest through the log, two builds side by side: a base
# build (AB_BASE, e.g. one built from an earlier commit) and this checkout's,
# each a node of its own topic on the same broker, alternated round by round
# (open loop, `pollbox load --mix ingest:100`, 512 B, at AB_RATE and at
# AB_LOW_RATE). Answer p50/p99/p99.9 and the node's CPU per message; the
# medians and the p99 of the new build against the base's. It is how a
# change to the log's ingest path shows it keeps single messages' latency.
# Each node: one worker, on LOG_NODE_CPU; the generator with the broker.
#
#   AB_BASE=/tmp/base-target/release/pollbox benches/log/ab-single.sh
#
# Knobs: AB_BASE (required), AB_RATE (2000), AB_LOW_RATE (500),
# AB_CONNECTIONS (16), AB_DURATION (10 s), AB_REPS (3), AB_TAG
# (results/DATE-ingest-single-ab-TAG.txt); lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
BASE=${AB_BASE:?AB_BASE: the pollbox binary of the base build}
RATE=${AB_RATE:-2000}
LOW=${AB_LOW_RATE:-500}
CONNS=${AB_CONNECTIONS:-16}
DUR=${AB_DURATION:-10}
REPS=${AB_REPS:-3}
OUT=$RESULTS/$(date -u +%F)-ingest-single-ab${AB_TAG:+-$AB_TAG}.txt
build
broker_up
quiet
header "$OUT" "AB_BASE=$BASE AB_RATE=$RATE AB_LOW_RATE=$LOW AB_CONNECTIONS=$CONNS AB_DURATION=$DUR AB_REPS=$REPS benches/log/ab-single.sh"
echo "# base: $BASE ($(sha1sum "$BASE" | cut -c1-12)); new: this checkout's release build" | tee -a "$OUT"
echo "# pollbox load --mix ingest:100 --body-bytes 512 --keys 1000 --warmup 2s -d ${DUR}s -c $CONNS --rate $RATE and --rate $LOW" | tee -a "$OUT"

topic_create "ab-base-$$" 4
topic_create "ab-new-$$" 4
NEW_BIN=$POLLBOX
cp "$BASE" "$WORK/bin/pollbox-base"
POLLBOX=$WORK/bin/pollbox-base node_up base 19211 "ab-base-$$"
declare -A PID_OF=([base]=$NODE_PID)
node_up new 19212 "ab-new-$$"
PID_OF[new]=$NODE_PID
declare -A PORT_OF=([base]=19211 [new]=19212)
wait_ready 19211 60
wait_ready 19212 60

# load NAME RATE REP: one run; prints its line.
load() {
  local name=$1 rate=$2 rep=$3 t0 t1
  local json=$WORK/$name-$rate-$rep.json
  t0=$(ticks "${PID_OF[$name]}")
  "$NEW_BIN" load --url "http://127.0.0.1:${PORT_OF[$name]}" --mix ingest:100 --body-bytes 512 \
    --keys 1000 --warmup 2s -d "${DUR}s" -c "$CONNS" --rate "$rate" --json "$json" -q >"$WORK/load.txt" 2>&1 \
    || { echo "load failed:"; cat "$WORK/load.txt"; }
  t1=$(ticks "${PID_OF[$name]}")
  python3 - "$json" "$name" "$rate" "$rep" "$((t1 - t0))" "$HZ" "$DUR" <<'PY'
import json, sys
path, name, rate, rep, t, hz, dur = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]
msgs = r["messages_per_s"] * (float(dur) + (r.get("warmup_s", 0) or 0))
cpu = int(t) / int(hz) * 1e6 / max(msgs, 1)
print(f"{name:5s} at {rate:>5s}/s rep {rep}  p50 {l['p50']:.3f}  p99 {l['p99']:.3f}  p99.9 {l['p999']:.3f} ms  errors {r['errors_total']}  node CPU {cpu:.1f} us/msg")
PY
}

# A fresh broker's JIT: left out.
DUR=5 load base "$RATE" 0 >/dev/null
DUR=5 load new "$RATE" 0 >/dev/null
{
  for rep in $(seq 1 "$REPS"); do
    for rate in "$RATE" "$LOW"; do
      load base "$rate" "$rep"
      load new "$rate" "$rep"
    done
  done
} | tee -a "$OUT"

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+)\s+at\s+(\d+)/s rep \d+\s+p50 ([\d.]+)\s+p99 ([\d.]+)\s+p99.9 ([\d.]+).*node CPU ([\d.]+)", line)
    if m:
        rows.setdefault((m[2], m[1]), []).append([float(m[i]) for i in range(3, 7)])
print("# medians: p50 / p99 / p99.9 ms, node CPU us/msg")
for (rate, name), rs in sorted(rows.items()):
    med = [st.median(c) for c in zip(*rs)]
    print(f"median {name:5s} at {rate:>5s}/s  {med[0]:.3f} / {med[1]:.3f} / {med[2]:.3f} ms  node {med[3]:.1f} us/msg  ({len(rs)} runs)")
for rate in sorted({r for r, _ in rows}):
    b = st.median(r[1] for r in rows[(rate, "base")]); n = st.median(r[1] for r in rows[(rate, "new")])
    print(f"# at {rate}/s: p99 new / base = {n / b:.2f} ({n:.3f} / {b:.3f} ms)")
PY
echo "# raw: $OUT"
