#!/usr/bin/env bash
# Publish on node A, event on node B: two nodes of one log (one worker each,
# both on LOG_NODE_CPU); `logbench stream` (on LOG_LOAD_CPU, with the broker)
# holds an event stream of a fresh key open on B and POSTs that key on A at
# STREAM_RATE; latency from each POST's send to its event on B. The same
# with the stream on A (one node: publish to event), alternated.
#
#   benches/log/stream.sh            # results/DATE-stream.txt
#
# Knobs: STREAM_RATE (200), STREAM_COUNT (2000), STREAM_REPS (3); lib.sh's LOG_*.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
RATE=${STREAM_RATE:-200}
COUNT=${STREAM_COUNT:-2000}
REPS=${STREAM_REPS:-3}
OUT=$RESULTS/$(date -u +%F)-stream.txt
build
broker_up
quiet
header "$OUT" "STREAM_RATE=$RATE STREAM_COUNT=$COUNT STREAM_REPS=$REPS benches/log/stream.sh"
TOPIC=stream-$$
topic_create "$TOPIC" 4
node_up a 19301 "$TOPIC"
node_up b 19302 "$TOPIC"
wait_ready 19301 60
wait_ready 19302 60
# Publishes first (3 s): the producer's connection and metadata, a warm broker.
"$LOGBENCH" stream --publish 127.0.0.1:19301 --subscribe 127.0.0.1:19302 --count 600 --rate 200 >/dev/null

{
  for rep in $(seq 1 "$REPS"); do
    for sub in b a; do
      sport=19302
      [[ $sub == a ]] && sport=19301
      r=$("$LOGBENCH" stream --publish 127.0.0.1:19301 --subscribe "127.0.0.1:$sport" \
        --count "$COUNT" --rate "$RATE")
      python3 - "$r" "$sub" "$rep" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); sub, rep = sys.argv[2:]
e, p = r["event"], r["publish_answered"]
print(f"A -> {sub.upper()}  rep {rep}  events {r['events']}/{r['published']}  event p50 {e['p50_us']/1e3:.3f}  p99 {e['p99_us']/1e3:.3f}  p99.9 {e['p999_us']/1e3:.3f}  max {e['max_us']/1e3:.3f} ms"
      f"  |  A answered p50 {p['p50_us']/1e3:.3f}  p99 {p['p99_us']/1e3:.3f} ms  errors {r['publish_errors']}  late sends {r['late_sends']}")
PY
    done
  done
} >"$WORK/lines"
tee -a "$OUT" <"$WORK/lines"
python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"A -> (\S)\s+rep.*event p50 ([\d.]+)\s+p99 ([\d.]+)\s+p99.9 ([\d.]+).*answered p50 ([\d.]+)\s+p99 ([\d.]+)", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[i]) for i in range(2, 7)])
for k, rs in rows.items():
    med = [st.median(c) for c in zip(*rs)]
    print(f"median A -> {k}  event p50 {med[0]:.3f}  p99 {med[1]:.3f}  p99.9 {med[2]:.3f} ms  |  A answered p50 {med[3]:.3f}  p99 {med[4]:.3f} ms  ({len(rs)} runs)")
PY
echo "# raw: $OUT"
