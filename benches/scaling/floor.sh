#!/usr/bin/env bash
# Floors for the seed's shape on one worker (seed-ab.sh's run of seed.sh): what the
# machine and the load generator cost alone, to judge pollbox's poll latency beside
# batch ingest against. Four modes, interleaved rep by rep:
#   idle     polls to pollbox, no ingest
#   pollbox  polls and batch ingest both to pollbox (seed.sh's shape)
#   sink     polls to pollbox, the ingest at the same rate to benches/scaling/sink.c on
#            the server's cores: what the generator and the kernel cost, without
#            pollbox's batch work
#   floor    polls to the sink, no pollbox, no ingest: the machine + generator floor
# Polls: 4000/s open-loop over 200 connections on 1000 keys (--preseed); ingest:
# batches of 100 x 512 B open-loop at FLOOR_RATE msg/s, -c 64 --pipeline 4.
#
#   benches/scaling/floor.sh           # a 2-core machine: server on CPU 0, generators on CPU 1
#
# Knobs: FLOOR_BIN (pollbox binary; default this tree's release build, built with
# cargo), FLOOR_SINK (sink binary; default sink.c built with cc into FLOOR_OUT),
# FLOOR_SERVER_CPUS (0), FLOOR_INGEST_CPUS (1), FLOOR_POLL_CPUS (1), FLOOR_WORKERS
# (1: pollbox --workers and the sink's threads), FLOOR_RATE (ingest msg/s, 600000),
# FLOOR_REPS (3), FLOOR_DURATION (s, 10), FLOOR_WARMUP (s, 2), FLOOR_MODES
# ("idle pollbox sink floor"), FLOOR_OUT (raw folder). On 16 cores, e.g.:
#   FLOOR_BIN=./pollbox FLOOR_SERVER_CPUS=0-7 FLOOR_WORKERS=8 FLOOR_INGEST_CPUS=8-11 \
#     FLOOR_POLL_CPUS=14-15 FLOOR_RATE=1200000 benches/scaling/floor.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benches/scaling/lib.sh
. "$ROOT/benches/scaling/lib.sh"
SERVER_CPUS=${FLOOR_SERVER_CPUS:-0}
INGEST_CPUS=${FLOOR_INGEST_CPUS:-1}
POLL_CPUS=${FLOOR_POLL_CPUS:-1}
W=${FLOOR_WORKERS:-1}
RATE=${FLOOR_RATE:-600000}
REPS=${FLOOR_REPS:-3}
DUR=${FLOOR_DURATION:-10}
WARMUP=${FLOOR_WARMUP:-2}
MODES=${FLOOR_MODES:-idle pollbox sink floor}
POLL_RATE=4000
POLL_CONNS=200
KEYS=1000
BATCH=100
BODY=512
OUTDIR=${FLOOR_OUT:-$(mktemp -d /tmp/pollbox-floor.XXXXXX)}
mkdir -p "$OUTDIR"
prepare_server "$OUTDIR" "${FLOOR_BIN:-}"
SINK=${FLOOR_SINK:-$OUTDIR/sink}
[[ -n ${FLOOR_SINK:-} ]] || cc -O2 -pthread -o "$SINK" "$ROOT/benches/scaling/sink.c"
count() { taskset -c "$1" nproc; }

{
    run_header floor.sh
    echo "# $W workers / sink threads on $SERVER_CPUS; ingest generator on $INGEST_CPUS, poll generator on $POLL_CPUS"
    echo "# polls: $POLL_RATE/s open-loop over $POLL_CONNS connections, $KEYS keys; ingest: batches of $BATCH x $BODY B at $RATE msg/s, open-loop"
    echo "# modes: $MODES; ${DUR}s measured after ${WARMUP}s warm-up (the ingest runs 1 s longer on each side); reps $REPS"
} | tee "$OUTDIR/header.txt"

# The sink on the server's cores, port $1, output to $2; its pid is left in SINKPID.
start_sink() {
    taskset -c "$SERVER_CPUS" "$SINK" "$1" "$W" >"$2" 2>&1 &
    SINKPID=$!
    wait_ready "$1"
}

port=19600
for rep in $(seq 1 "$REPS"); do
    for mode in $MODES; do
        port=$((port + 2))
        base=$OUTDIR/$mode-r$rep
        SRV="" SINKPID=""
        case $mode in
            idle | pollbox | sink) start_server "$SERVER_CPUS" "$port" "$W" "$base.server.log" ;;
            floor) start_sink "$port" "$base.sink.log" ;;
            *) echo "floor.sh: unknown mode $mode" >&2; exit 2 ;;
        esac
        ing=""
        if [[ $mode == pollbox || $mode == sink ]]; then
            ingest_port=$port
            if [[ $mode == sink ]]; then
                ingest_port=$((port + 1))
                start_sink "$ingest_port" "$base.sink.log"
            fi
            taskset -c "$INGEST_CPUS" "$BIN" load --url "http://127.0.0.1:$ingest_port" -t "$(count "$INGEST_CPUS")" \
                --mix batch:100 --batch-size "$BATCH" --body-bytes "$BODY" --keys "$KEYS" -c 64 --pipeline 4 \
                -R $((RATE / BATCH)) -d "$((DUR + 2))s" -q --json "$base.ingest.json" >"$base.ingest.txt" 2>&1 &
            ing=$!
            sleep 1
        fi
        s0=0 s1=0 k0=0 k1=0
        [[ -z $SRV ]] || s0=$(cpu_ticks "$SRV")
        [[ -z $SINKPID ]] || k0=$(cpu_ticks "$SINKPID")
        taskset -c "$POLL_CPUS" "$BIN" load --url "http://127.0.0.1:$port" -t "$(count "$POLL_CPUS")" \
            --mix poll:100 --keys "$KEYS" --preseed -c "$POLL_CONNS" -R "$POLL_RATE" \
            -d "${DUR}s" --warmup "${WARMUP}s" -q --json "$base.poll.json" >"$base.poll.txt" 2>&1 || true
        [[ -z $SRV ]] || s1=$(cpu_ticks "$SRV")
        [[ -z $SINKPID ]] || k1=$(cpu_ticks "$SINKPID")
        [[ -z $ing ]] || wait "$ing" || true
        if [[ -n $SRV ]]; then
            python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' \
                "http://127.0.0.1:$port/metrics" >"$base.metrics" 2>/dev/null || true
            stop_server
        fi
        if [[ -n $SINKPID ]]; then
            kill "$SINKPID"
            wait "$SINKPID" 2>/dev/null || true
        fi
        python3 - "$base" "$mode" "$rep" "$((s1 - s0))" "$((k1 - k0))" "$HZ" "$((DUR + WARMUP))" \
            "$OUTDIR/runs.jsonl" <<'PY'
import json, sys
base, mode, rep, pticks, sticks, hz, span, runs = sys.argv[1:]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
p = load(base + ".poll.json")
i = load(base + ".ingest.json") if mode in ("pollbox", "sink") else None
nan = float("nan")
r = {"mode": mode, "rep": int(rep),
     "mps": i["messages_per_s"] if i else (nan if mode in ("pollbox", "sink") else 0.0),
     "ingest_errors": i["errors_total"] if i else (-1 if mode in ("pollbox", "sink") else 0),
     "polls": p["achieved_rate"] if p else nan, "errors": p["errors_total"] if p else -1,
     "pollbox": int(pticks) / int(hz) / int(span), "sink": int(sticks) / int(hz) / int(span)}
for q in ("p50", "p90", "p99", "p999", "max"):
    r[q] = p["latency_ms"][q] * 1000 if p else nan
print(f"{mode:<7} rep {rep}  achieved {r['mps']:10.0f} msg/s  polls {r['polls']:7.0f}/s  "
      f"p50 {r['p50']:6.1f} us  p90 {r['p90']:6.1f} us  p99 {r['p99']:6.1f} us  p99.9 {r['p999']:7.1f} us  "
      f"max {r['max']:8.1f} us  errors {r['errors']}  ingest errors {r['ingest_errors']}  "
      f"pollbox {r['pollbox']:.2f} cores  sink {r['sink']:.2f} cores")
with open(runs, "a") as f:
    f.write(json.dumps(r) + "\n")
PY
    done
done | tee "$OUTDIR/lines.txt"

python3 - "$OUTDIR/runs.jsonl" <<'PY' | tee "$OUTDIR/summary.md"
import collections, json, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["mode"]].append(r)
keys = ("mps", "polls", "p50", "p90", "p99", "p999", "max", "pollbox", "sink")
med = {m: {k: statistics.median(r[k] for r in v) for k in keys} for m, v in rows.items()}
idle = med.get("idle", {}).get("p99")
print("\n| mode | ingest msg/s | polls/s | poll p50 µs | p90 | p99 | p99.9 | max | p99 / idle | pollbox cores | sink cores | errors | runs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for mode, m in med.items():
    ratio = f"{m['p99'] / idle:.2f}x" if idle else "n/a"
    errors = str(sum(max(r["errors"], 0) + max(r["ingest_errors"], 0) for r in rows[mode]))
    missing = sum(r["errors"] < 0 or r["ingest_errors"] < 0 for r in rows[mode])
    errors += f" ({missing} without a report)" if missing else ""
    print(f"| {mode} | {m['mps']:,.0f} | {m['polls']:,.0f} | {m['p50']:.1f} | {m['p90']:.1f} | {m['p99']:.1f} | "
          f"{m['p999']:.1f} | {m['max']:.1f} | {ratio} | {m['pollbox']:.2f} | {m['sink']:.2f} | {errors} | {len(rows[mode])} |")
PY
echo "# raw reports: $OUTDIR"
