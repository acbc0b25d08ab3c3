#!/usr/bin/env bash
# Poll latency while a node consumes. One node of a log (one worker; the whole
# process on LOG_NODE_CPU, its consuming thread included), polled open-loop by
# `pollbox load --mix poll:100` (POLL_RATE over POLL_CONNECTIONS on 1,000
# boxes) from LOG_LOAD_CPU, in four states, alternated:
#   idle          caught up on a small topic (the same 10,000 keys), nothing coming
#   replay        started on a big filled topic: polled while it replays as fast
#                 as it can (its consuming and client threads run at nice 19: they
#                 take what the worker leaves of the core)
#   live          caught up on the small topic while `logbench fill` (at nice 19,
#                 beside the broker and the generator) produces POLL_LIVE_RATE
#                 records/s into it
#   +nice0        the same with every thread of the node reniced to 0 after start
#                 (the worker's priority: how pollbox ran before b414f76)
# Each line: the records/s the node applied during the polls (from
# pollbox_log_records_total), poll p50/p99/p99.9, the generator's own send
# lateness p99 (a witness of the load core being taken), the node's CPU.
#
#   benches/log/poll.sh              # results/DATE-poll.txt
#
# Knobs: POLL_RATE (4000), POLL_CONNECTIONS (200), POLL_DURATION (8 s),
# POLL_REPS (3), POLL_LIVE_RATE (100000),
# POLL_STATES ("idle replay replay+nice0 live"), POLL_TOPIC (a filled
# topic to replay; else POLL_RECORDS (10000000) are filled); lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
RATE=${POLL_RATE:-4000}
CONNS=${POLL_CONNECTIONS:-200}
DUR=${POLL_DURATION:-8}
REPS=${POLL_REPS:-3}
LIVE=${POLL_LIVE_RATE:-100000}
STATES=${POLL_STATES:-idle replay replay+nice0 live}
RECORDS=${POLL_RECORDS:-10000000}
OUT=$RESULTS/$(date -u +%F)-poll.txt
build
broker_up
quiet
header "$OUT" "POLL_RATE=$RATE POLL_CONNECTIONS=$CONNS POLL_DURATION=$DUR POLL_REPS=$REPS POLL_LIVE_RATE=$LIVE POLL_STATES='$STATES' benches/log/poll.sh"
echo "# pollbox load --mix poll:100 --keys 1000 -c $CONNS --rate $RATE --warmup 1s -d ${DUR}s" | tee -a "$OUT"

SMALL=polls-small-$$
topic_create "$SMALL" 4
"$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$SMALL" --records 100000 --keys 10000 >/dev/null
if [[ -n "${POLL_TOPIC:-}" ]]; then
  BIG=$POLL_TOPIC
else
  BIG=polls-big-$$
  topic_create "$BIG" 4
  echo "# filling $BIG with $RECORDS records" | tee -a "$OUT"
  taskset -c "$NODE_CPU" "$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$BIG" --records "$RECORDS" --keys 10000 | tee -a "$OUT"
fi
echo "# replayed topic: $BIG; idle and live: $SMALL (100,000 records, then the live ones)" | tee -a "$OUT"

port=19400
one() { # STATE REP
  local state=$1 rep=$2 topic=$SMALL fill="" pid r0 r1 t0 t1
  port=$((port + 1))
  [[ $state == replay* ]] && topic=$BIG
  node_up "poll-$state-$rep" "$port" "$topic"
  pid=$NODE_PID
  if [[ $state == replay* ]]; then
    # Polled boxes exist once the first 10,000 records are in.
    until curl -sf "http://127.0.0.1:$port/v1/boxes/lg-999" >/dev/null 2>&1; do sleep 0.01; done
  else
    wait_ready "$port" 120
  fi
  if [[ $state == *+nice0 ]]; then
    local t
    for t in /proc/"$pid"/task/*; do renice -n 0 -p "${t##*/}" >/dev/null; done
  fi
  if [[ $state == live* ]]; then
    nice -n 19 "$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$SMALL" --records $((LIVE * (DUR + 4))) --rate "$LIVE" \
      --keys 10000 >"$WORK/live.json" &
    fill=$!
    STARTED_PIDS+=("$fill")
    sleep 1
  fi
  # The warm-up second is left out of the latencies; the window is what follows.
  "$POLLBOX" load --url "http://127.0.0.1:$port" --mix poll:100 --keys 1000 -c "$CONNS" \
    --rate "$RATE" --warmup 1s -d "${DUR}s" --json "$WORK/load.json" -q >"$WORK/load.txt" 2>&1 &
  local lpid=$!
  sleep 1
  r0=$(metric "$port" pollbox_log_records_total); t0=$(ticks "$pid")
  sleep "$DUR"
  r1=$(metric "$port" pollbox_log_records_total); t1=$(ticks "$pid")
  local caught
  caught=$(metric "$port" pollbox_log_caught_up)
  wait "$lpid" || { echo "load failed:"; cat "$WORK/load.txt"; }
  if [[ -n "$fill" ]]; then wait "$fill" || true; fi
  node_down "$pid"
  python3 - "$WORK/load.json" "$state" "$rep" "$((r1 - r0))" "$((t1 - t0))" "$HZ" "$DUR" "$caught" <<'PY'
import json, sys
path, state, rep, recs, t, hz, dur, caught = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]; late = r["send_lateness_ms"]
print(f"{state:18s} rep {rep}  consumed {int(recs) / float(dur):9,.0f} records/s  polls {r['achieved_rate']:6,.0f}/s  "
      f"p50 {l['p50']:.3f}  p99 {l['p99']:.3f}  p99.9 {l['p999']:.3f}  max {l['max']:.3f} ms  "
      f"generator lateness p99 {late['p99']:.3f} ms  node CPU {int(t) / int(hz) / float(dur):.2f} of a core  "
      f"errors {r['errors_total']}  caught up at the end {caught}")
PY
}

for rep in $(seq 1 "$REPS"); do
  for s in $STATES; do
    one "$s" "$rep" >"$WORK/line"
    tee -a "$OUT" <"$WORK/line"
  done
done

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+rep \d+\s+consumed\s+([\d,]+) records/s.*p50 ([\d.]+)\s+p99 ([\d.]+)\s+p99.9 ([\d.]+).*lateness p99 ([\d.]+)", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[2].replace(",", ""))] + [float(m[i]) for i in range(3, 7)])
idle = st.median(r[2] for r in rows["idle"]) if "idle" in rows else float("nan")
for k, rs in rows.items():
    med = [st.median(c) for c in zip(*rs)]
    print(f"median {k:18s} consumed {med[0]:9,.0f} records/s  poll p50 {med[1]:.3f}  p99 {med[2]:.3f}  p99.9 {med[3]:.3f} ms  "
          f"lateness p99 {med[4]:.3f} ms  p99 / idle p99 {med[2] / idle:.2f}x  ({len(rs)} runs)")
PY
echo "# raw: $OUT"
