#!/usr/bin/env bash
# Connections placed by load against the kernel's SO_REUSEPORT hash alone
# (docs/operations.md#workers): W pinned workers, C closed-loop batch-ingest
# connections (a few per worker, where the hash leaves some workers idle), the
# two modes of one build interleaved. Prints msg/s and each worker's CPU.
#
#   benches/scaling/placement.sh        # builds; needs W + 1 cores at least
#
# Knobs: PLACE_WORKERS (8), PLACE_CONNECTIONS (8), PLACE_SERVER_CPUS (first W
# cores), PLACE_LOAD_CPUS (the rest), PLACE_DURATION (s, 6), PLACE_REPS (3),
# PLACE_POLLBOX (binary; default this tree's release build), PLACE_OUT (raw folder).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benches/scaling/lib.sh
. "$ROOT/benches/scaling/lib.sh"
NCPU=$(nproc)
W=${PLACE_WORKERS:-8}
C=${PLACE_CONNECTIONS:-8}
SERVER_CPUS=${PLACE_SERVER_CPUS:-0-$((W - 1))}
LOAD_CPUS=${PLACE_LOAD_CPUS:-$W-$((NCPU - 1))}
DUR=${PLACE_DURATION:-6}
REPS=${PLACE_REPS:-3}
OUTDIR=${PLACE_OUT:-$(mktemp -d /tmp/pollbox-placement.XXXXXX)}
mkdir -p "$OUTDIR"
prepare_server "$OUTDIR" "${PLACE_POLLBOX:-}"
SCALE_PLACEMENT="hash" pinned_config "$OUTDIR/hash.toml"
cp "$CFG" "$OUTDIR/load.toml"
threads=$(taskset -c "$LOAD_CPUS" nproc)

# utime + stime of each worker thread of process $1, in clock ticks, by worker.
worker_ticks() {
    for t in /proc/"$1"/task/*; do
        if [[ $(cat "$t/comm") == pollbox-w* ]]; then echo "$(cat "$t/comm") $(awk '{print $14 + $15}' "$t/stat")"; fi
    done | sort -V
}

{
    run_header placement.sh
    echo "# $W workers on $SERVER_CPUS; batch ingest (100 x 512 B) over $C connections, pipeline 4, closed loop, from $LOAD_CPUS; ${DUR}s; reps $REPS"
} | tee "$OUTDIR/header.txt"
port=19700
for rep in $(seq 1 "$REPS"); do
    for mode in hash load; do
        port=$((port + 1))
        CFG=$OUTDIR/$mode.toml
        start_server "$SERVER_CPUS" "$port" "$W" "$OUTDIR/$mode-r$rep.server.log"
        worker_ticks "$SRV" >"$OUTDIR/$mode-r$rep.t0"
        taskset -c "$LOAD_CPUS" "$BIN" load --url "http://127.0.0.1:$port" -t "$threads" -c "$C" --pipeline 4 \
            --mix batch:100 --batch-size 100 --body-bytes 512 --keys 1000 -d "${DUR}s" -q \
            --json "$OUTDIR/$mode-r$rep.json" >/dev/null 2>&1 &
        gen=$!
        # Where the connections are, half-way (the scrape's own is one of them).
        sleep "$((DUR / 2))"
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
            "http://127.0.0.1:$port/metrics" >"$OUTDIR/$mode-r$rep.metrics" 2>/dev/null || true
        wait "$gen" || true
        worker_ticks "$SRV" >"$OUTDIR/$mode-r$rep.t1"
        stop_server
        python3 - "$OUTDIR/$mode-r$rep" "$mode" "$rep" "$HZ" "$DUR" <<'PY'
import json, re, sys
base, mode, rep, hz, dur = sys.argv[1:]
t0 = dict(l.split() for l in open(base + ".t0"))
t1 = dict(l.split() for l in open(base + ".t1"))
cores = [(int(t1[k]) - int(t0.get(k, 0))) / int(hz) / int(dur) for k in t1]
conns = [int(float(m.group(1))) for m in re.finditer(r'^pollbox_worker_connections\{worker="\d+"\} (\S+)', open(base + ".metrics").read(), re.M)]
d = json.load(open(base + ".json"))
print(f"{mode:4s} rep {rep}  {d['messages_per_s']:10.0f} msg/s  errors {d['errors_total']}  "
      f"worker cores {' '.join(f'{c:.2f}' for c in cores)}  min {min(cores):.2f} max {max(cores):.2f}  "
      f"connections per worker {conns}")
PY
    done
done | tee "$OUTDIR/lines.txt"
python3 - "$OUTDIR/lines.txt" <<'PY' | tee "$OUTDIR/summary.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    rows[p[0]].append((float(p[3]), float(p[p.index("min") + 1]), float(p[p.index("max") + 1])))
print("\n| placement | msg/s | least busy worker, cores | busiest | runs |")
print("|---|---:|---:|---:|---:|")
for mode, v in rows.items():
    m = [statistics.median(x[i] for x in v) for i in range(3)]
    print(f"| {mode} | {m[0]:,.0f} | {m[1]:.2f} | {m[2]:.2f} | {len(v)} |")
if "hash" in rows and "load" in rows:
    h = statistics.median(x[0] for x in rows["hash"]); l = statistics.median(x[0] for x in rows["load"])
    print(f"\nload / hash: {l / h:.2f}x msg/s")
PY
echo "# raw reports: $OUTDIR"
