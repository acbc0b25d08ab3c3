#!/usr/bin/env bash
# The seed's shape on one node: polls of small boxes at a few
# thousand per second while batch ingest runs at a fixed rate, both open-loop, on
# SEED_WORKERS pinned workers; the poll latency with and without the ingest beside it.
# The seed's Rust service: 1.2 M messages/s in, polls at p50 48 µs and p99 65 µs.
#
#   benches/scaling/seed.sh            # builds; needs 2 + SEED_WORKERS cores at least
#
# Knobs: SEED_WORKERS (8), SEED_SERVER_CPUS (first SEED_WORKERS cores), SEED_INGEST_CPUS
# and SEED_POLL_CPUS (the generators' cores, default the remaining cores split in two),
# SEED_INGEST_RATES (messages/s, "0 1200000 2400000"; 0 = polls alone), SEED_POLL_RATE
# (polls/s, 4000), SEED_POLL_CONNECTIONS (200), SEED_KEYS (1000), SEED_BATCH (100),
# SEED_BODY_BYTES (512), SEED_DURATION (s, 10), SEED_WARMUP (s, 2), SEED_REPS (3),
# SEED_POLLBOX (binary; default this tree's release build), SEED_OUT (raw folder),
# SEED_JITTER_CPUS (e.g. "12,13": spare cores that run benches/scaling/jitter.c during
# each measurement, a witness of how much the machine took cores away; its binary is
# SEED_JITTER_BIN or built with cc).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benches/scaling/lib.sh
. "$ROOT/benches/scaling/lib.sh"
NCPU=$(nproc)
W=${SEED_WORKERS:-8}
[[ -n ${SEED_SERVER_CPUS:-} ]] || ((NCPU >= W + 2)) || { echo "seed.sh: needs $((W + 2)) cores, has $NCPU" >&2; exit 1; }
SERVER_CPUS=${SEED_SERVER_CPUS:-0-$((W - 1))}
rest=$((NCPU - W))
INGEST_CPUS=${SEED_INGEST_CPUS:-$W-$((W + rest / 2 - 1))}
POLL_CPUS=${SEED_POLL_CPUS:-$((W + rest / 2))-$((NCPU - 1))}
RATES=${SEED_INGEST_RATES:-0 1200000 2400000}
POLL_RATE=${SEED_POLL_RATE:-4000}
POLL_CONNS=${SEED_POLL_CONNECTIONS:-200}
KEYS=${SEED_KEYS:-1000}
BATCH=${SEED_BATCH:-100}
BODY=${SEED_BODY_BYTES:-512}
DUR=${SEED_DURATION:-10}
WARMUP=${SEED_WARMUP:-2}
REPS=${SEED_REPS:-3}
OUTDIR=${SEED_OUT:-$(mktemp -d /tmp/pollbox-seed.XXXXXX)}
mkdir -p "$OUTDIR"
prepare_server "$OUTDIR" "${SEED_POLLBOX:-}"
count() { taskset -c "$1" nproc; }
JITTER_CPUS=${SEED_JITTER_CPUS:-}
if [[ -n $JITTER_CPUS ]]; then
    JITTER=${SEED_JITTER_BIN:-$OUTDIR/jitter}
    [[ -x $JITTER ]] || cc -O2 -o "$JITTER" "$ROOT/benches/scaling/jitter.c"
fi

{
    run_header seed.sh
    echo "# $W workers on $SERVER_CPUS; ingest generator on $INGEST_CPUS, poll generator on $POLL_CPUS"
    echo "# polls: $POLL_RATE/s open-loop over $POLL_CONNS connections, $KEYS keys; ingest: batches of $BATCH x $BODY B, open-loop"
    echo "# ${DUR}s measured after ${WARMUP}s warm-up (the ingest runs 1 s longer on each side); reps $REPS"
} | tee "$OUTDIR/header.txt"

port=19300
for rep in $(seq 1 "$REPS"); do
    for rate in $RATES; do
        port=$((port + 1))
        base=$OUTDIR/ingest$rate-r$rep
        start_server "$SERVER_CPUS" "$port" "$W" "$base.server.log"
        ing=""
        if ((rate > 0)); then
            taskset -c "$INGEST_CPUS" "$BIN" load --url "http://127.0.0.1:$port" -t "$(count "$INGEST_CPUS")" \
                --mix batch:100 --batch-size "$BATCH" --body-bytes "$BODY" --keys "$KEYS" -c 64 --pipeline 4 \
                -R $((rate / BATCH)) -d "$((DUR + 2))s" -q --json "$base.ingest.json" >"$base.ingest.txt" 2>&1 &
            ing=$!
            sleep 1
        fi
        jit=()
        for j in ${JITTER_CPUS//,/ }; do
            taskset -c "$j" "$JITTER" "$((DUR + WARMUP))" "$j" >"$base.jitter$j" &
            jit+=($!)
        done
        c0=$(cpu_ticks "$SRV")
        taskset -c "$POLL_CPUS" "$BIN" load --url "http://127.0.0.1:$port" -t "$(count "$POLL_CPUS")" \
            --mix poll:100 --keys "$KEYS" --preseed -c "$POLL_CONNS" -R "$POLL_RATE" \
            -d "${DUR}s" --warmup "${WARMUP}s" -q --json "$base.poll.json" >"$base.poll.txt" 2>&1 || true
        c1=$(cpu_ticks "$SRV")
        [[ -z $ing ]] || wait "$ing" || true
        for j in "${jit[@]}"; do wait "$j" || true; done
        # The server's own view (request durations, epoch work) beside the client's.
        python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
            "http://127.0.0.1:$port/metrics" >"$base.metrics" 2>/dev/null || true
        stop_server
        python3 - "$base" "$rate" "$rep" "$((c1 - c0))" "$HZ" "$((DUR + WARMUP))" <<'PY'
import json, sys
base, rate, rep, ticks, hz, span = sys.argv[1:]
p = json.load(open(base + ".poll.json"))
mps = 0.0
if int(rate):
    try:
        mps = json.load(open(base + ".ingest.json"))["messages_per_s"]
    except (OSError, ValueError, KeyError):
        mps = -1.0
l = p["latency_ms"]
us = lambda k: l[k] * 1000
print(f"ingest {int(rate):>8d}/s rep {rep}  achieved {mps:10.0f} msg/s  polls {p['achieved_rate']:7.0f}/s  "
      f"p50 {us('p50'):6.1f} us  p90 {us('p90'):6.1f} us  p99 {us('p99'):6.1f} us  p99.9 {us('p999'):7.1f} us  "
      f"max {us('max'):8.1f} us  errors {p['errors_total']}  server {int(ticks) / int(hz) / int(span):.2f} cores")
PY
    done
done | tee "$OUTDIR/lines.txt"

python3 - "$OUTDIR/lines.txt" <<'PY' | tee "$OUTDIR/summary.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    # achieved msg/s, p50, p90, p99, p99.9, max (us), server cores
    rows[p[1]].append([float(p[i]) for i in (5, 10, 13, 16, 19, 22, 27)])
print("\n| ingest offered | ingest achieved msg/s | poll p50 µs | p90 | p99 | p99.9 | max | server cores | runs |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for rate, v in rows.items():
    m = [statistics.median(x[i] for x in v) for i in range(7)]
    print(f"| {rate} | {m[0]:,.0f} | {m[1]:.1f} | {m[2]:.1f} | {m[3]:.1f} | {m[4]:.1f} | {m[5]:.1f} | {m[6]:.2f} | {len(v)} |")
PY
if [[ -n $JITTER_CPUS ]]; then
    echo "# jitter on spare cores during each measurement (benches/scaling/jitter.c):"
    for f in "$OUTDIR"/*.jitter*; do echo "$(basename "${f%.jitter*}"): $(cat "$f")"; done
fi
echo "# raw reports: $OUTDIR"
