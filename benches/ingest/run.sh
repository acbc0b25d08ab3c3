#!/usr/bin/env bash
# End-to-end batch ingest on one worker core: messages/s that
# pollbox validates and applies, the server pinned to one core and `pollbox load`
# to the other, each build measured REPS times, interleaved, in one run.
#
#   benches/ingest/run.sh                       # this tree's release build
#   INGEST_BEFORE=/path/to/old/pollbox benches/ingest/run.sh   # before/after
#
# Knobs: INGEST_DURATION (s, 5), INGEST_REPS (3), INGEST_SIZES ("512 8192"),
# INGEST_BATCH (messages per request, 100), INGEST_CONNECTIONS (4),
# INGEST_PIPELINE (4), INGEST_KEYS (1000), INGEST_SERVER_CPU (0), INGEST_LOAD_CPU (1).
# The load generator is always this tree's (the same client for every server).
# Prints one line per run and the medians; raw reports go to $WORK (printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
DUR=${INGEST_DURATION:-5}
REPS=${INGEST_REPS:-3}
SIZES=${INGEST_SIZES:-512 8192}
BATCH=${INGEST_BATCH:-100}
CONNS=${INGEST_CONNECTIONS:-4}
DEPTH=${INGEST_PIPELINE:-4}
KEYS=${INGEST_KEYS:-1000}
SCPU=${INGEST_SERVER_CPU:-0}
LCPU=${INGEST_LOAD_CPU:-1}
WORK=$(mktemp -d /tmp/pollbox-ingest.XXXXXX)
cargo build --release -q -p pollbox
NOW=$PWD/target/release/pollbox
declare -A BIN=([now]=$NOW)
builds="now"
if [[ -n ${INGEST_BEFORE:-} ]]; then BIN[before]=$INGEST_BEFORE; builds="before now"; fi
port=18770
echo "# benches/ingest/run.sh: $(date -u +%FT%TZ), $(nproc) cores, duration ${DUR}s, reps $REPS,"
echo "# batch $BATCH messages, $CONNS connections x pipeline $DEPTH, $KEYS keys; raw: $WORK"
for size in $SIZES; do
  for rep in $(seq 1 "$REPS"); do
    for b in $builds; do
      port=$((port + 1))
      taskset -c "$SCPU" "${BIN[$b]}" serve --listen 127.0.0.1:$port --workers 1 >"$WORK/$b-$size-$rep.server.log" 2>&1 &
      srv=$!
      for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
      t0=$(awk '{print $14 + $15}' "/proc/$srv/stat")
      taskset -c "$LCPU" "$NOW" load --url "http://127.0.0.1:$port" --mix batch:100 \
        --batch-size "$BATCH" --body-bytes "$size" -c "$CONNS" --pipeline "$DEPTH" \
        --keys "$KEYS" -d "${DUR}s" --json "$WORK/$b-$size-$rep.json" >"$WORK/$b-$size-$rep.txt" 2>&1
      t1=$(awk '{print $14 + $15}' "/proc/$srv/stat")
      kill -INT $srv; wait $srv || true
      python3 - "$WORK/$b-$size-$rep.json" "$b" "$size" "$rep" "$((t1 - t0))" "$(getconf CLK_TCK)" "$DUR" <<'PY'
import json, sys
path, build, size, rep, ticks, hz, dur = sys.argv[1:]
r = json.load(open(path))
def find(o, k):
    if isinstance(o, dict):
        if k in o: return o[k]
        for v in o.values():
            x = find(v, k)
            if x is not None: return x
    if isinstance(o, list):
        for v in o:
            x = find(v, k)
            if x is not None: return x
mps = find(r, "messages_per_s") or 0
errors = find(r, "errors") or 0
cpu = int(ticks) / int(hz)
print(f"{build:7s} {int(size):5d} B  rep {rep}  {mps:12,.0f} messages/s  server CPU {cpu / float(dur):.2f} of a core  errors {errors}")
PY
    done
  done
done | tee "$WORK/lines.txt"
echo "# medians"
python3 - "$WORK/lines.txt" <<'PY'
import sys, statistics, collections
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    d[(p[0], p[1])].append(float(p[5].replace(",", "")))
for (b, size), v in sorted(d.items(), key=lambda x: (int(x[0][1]), x[0][0])):
    print(f"{b:7s} {size:>5s} B  median {statistics.median(v):12,.0f} messages/s  ({len(v)} runs)")
PY
