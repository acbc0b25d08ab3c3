#!/usr/bin/env bash
# Multi-core scaling: pollbox with 1, 2, 4 and 8 workers, each
# worker pinned to its own core, `pollbox load` on a disjoint set of cores, in one
# run with the worker counts interleaved rep by rep.
#
#   benches/scaling/run.sh                  # builds, ~5 min on a 16-core machine
#
# Tests (SCALE_TESTS):
#   poll-hot      every poll asks for one box (`--keys 1`), pipelined: all workers
#                 read the same box, so this is the shared-read path under contention
#   poll-uniform  polls over 10,000 boxes, uniform, pipelined
#   batch-512     batch ingest, 100 messages of 512 B per POST /v1/ingest, 1,000 keys
#   batch-8k      the same with 8 KiB messages
#
# Knobs (environment): SCALE_WORKERS ("1 2 4 8"), SCALE_SERVER_CPUS (cores the workers
# take, in order, default the first half of the machine), SCALE_LOAD_CPUS (the
# generator's cores, default the second half; one generator thread per core),
# SCALE_DURATION (s, 4), SCALE_WARMUP (s, 1), SCALE_REPS (3), SCALE_TESTS,
# SCALE_POLLBOX (binary to measure; default this tree's release build),
# SCALE_LOAD_POLLBOX (the binary whose `load` generates the traffic; default
# SCALE_POLLBOX, so two servers can be compared under one generator),
# SCALE_SKIP_BUILD=1, SCALE_OUT (raw reports and the summary, default a temp folder).
#
# Each line: requests/s and messages/s from the generator's report, and the CPU both
# sides used (server: utime+stime of /proc/PID/stat over the load's wall time;
# generator: its rusage), in cores. A generator near its core count means the
# generator, not the server, set the figure.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benches/scaling/lib.sh
. "$ROOT/benches/scaling/lib.sh"
NCPU=$(nproc)
HALF=$((NCPU / 2))
WORKERS=${SCALE_WORKERS:-1 2 4 8}
SERVER_CPUS=${SCALE_SERVER_CPUS:-$(seq -s ' ' 0 $((HALF - 1)))}
LOAD_CPUS=${SCALE_LOAD_CPUS:-$(seq -s , "$HALF" $((NCPU - 1)))}
DUR=${SCALE_DURATION:-4}
WARMUP=${SCALE_WARMUP:-1}
REPS=${SCALE_REPS:-3}
TESTS=${SCALE_TESTS:-poll-hot poll-uniform batch-512 batch-8k}
OUTDIR=${SCALE_OUT:-$(mktemp -d /tmp/pollbox-scaling.XXXXXX)}
mkdir -p "$OUTDIR"
LOAD_THREADS=$(taskset -c "$LOAD_CPUS" nproc)
prepare_server "$OUTDIR" "${SCALE_POLLBOX:-}" "${SCALE_SKIP_BUILD:-}"
read -r -a SCPUS <<<"$SERVER_CPUS"
LOAD_BIN=${SCALE_LOAD_POLLBOX:-$BIN}

# The load generator's arguments for each test.
load_args() {
    case $1 in
        poll-hot) echo "--mix poll:100 --keys 1 --preseed -c 256 --pipeline 16" ;;
        poll-uniform) echo "--mix poll:100 --keys 10000 --preseed -c 256 --pipeline 16" ;;
        batch-512) echo "--mix batch:100 --batch-size 100 --body-bytes 512 --keys 1000 -c 64 --pipeline 4" ;;
        batch-8k) echo "--mix batch:100 --batch-size 100 --body-bytes 8192 --keys 1000 -c 32 --pipeline 2" ;;
        *) echo "run.sh: unknown test $1" >&2; exit 1 ;;
    esac
}


{
    run_header run.sh
    echo "# threads per core: $(lscpu 2>/dev/null | awk -F: '/Thread\(s\) per core/ {gsub(/ /, "", $2); print $2}')"
    echo "# server cores (in order): $SERVER_CPUS; load cores: $LOAD_CPUS ($LOAD_THREADS generator threads)"
    echo "# server: $BIN; generator: $LOAD_BIN"
    echo "# workers: $WORKERS; tests: $TESTS; ${DUR}s measured after ${WARMUP}s warm-up; reps $REPS"
} | tee "$OUTDIR/header.txt"

port=19100
for rep in $(seq 1 "$REPS"); do
    for w in $WORKERS; do
        ((w <= ${#SCPUS[@]})) || { echo "run.sh: $w workers but only ${#SCPUS[@]} server cores" >&2; exit 1; }
        cores=$(tr ' ' , <<<"${SCPUS[*]:0:$w}")
        port=$((port + 1))
        start_server "$cores" "$port" "$w" "$OUTDIR/server-w$w-r$rep.log"
        for t in $TESTS; do
            base=$OUTDIR/$t-w$w-r$rep
            # shellcheck disable=SC2046 # load_args is a word list on purpose.
            set -- $(load_args "$t")
            c0=$(cpu_ticks "$SRV")
            s0=$(date +%s.%N)
            python3 - "$base" taskset -c "$LOAD_CPUS" "$LOAD_BIN" load --url "http://127.0.0.1:$port" \
                -t "$LOAD_THREADS" -d "${DUR}s" --warmup "${WARMUP}s" -q --json "$base.json" "$@" <<'PY'
import resource, subprocess, sys
base, cmd = sys.argv[1], sys.argv[2:]
with open(base + ".txt", "w") as out:
    rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
r = resource.getrusage(resource.RUSAGE_CHILDREN)
open(base + ".rusage", "w").write(f"{r.ru_utime} {r.ru_stime} {rc}\n")
PY
            s1=$(date +%s.%N)
            c1=$(cpu_ticks "$SRV")
            python3 - "$base" "$t" "$w" "$rep" "$((c1 - c0))" "$HZ" "$s0" "$s1" <<'PY'
import json, sys
base, test, w, rep, ticks, hz, s0, s1 = sys.argv[1:]
wall = float(s1) - float(s0)
lu, ls, rc = open(base + ".rusage").read().split()
try:
    r = json.load(open(base + ".json"))
    rps, mps, err = r["achieved_rate"], r["messages_per_s"], r["errors_total"]
except (OSError, ValueError, KeyError):
    rps = mps = 0.0
    err = "no-report"
print(f"{test:12s} w{int(w):<2d} rep {rep}  {rps:12.0f} req/s  {mps:12.0f} msg/s  "
      f"server {int(ticks) / int(hz) / wall:5.2f} cores  load {(float(lu) + float(ls)) / wall:5.2f} cores  "
      f"errors {err} rc {rc}")
PY
        done
        stop_server
    done
done | tee "$OUTDIR/lines.txt"

python3 - "$OUTDIR/lines.txt" "$WORKERS" <<'PY' | tee "$OUTDIR/summary.md"
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    test, w = p[0], int(p[1][1:])
    rows[(test, w)].append((float(p[4]), float(p[6]), float(p[9]), float(p[12])))
workers = [int(w) for w in sys.argv[2].split()]
print("\n| test | workers | req/s (median) | messages/s | × 1 worker | server cores used | load cores used | runs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for test in dict.fromkeys(t for t, _ in rows):
    base = None
    for w in workers:
        v = rows.get((test, w))
        if not v:
            continue
        rps = statistics.median(x[0] for x in v)
        mps = statistics.median(x[1] for x in v)
        key = mps if mps else rps
        base = base or key
        print(f"| {test} | {w} | {rps:,.0f} | {mps:,.0f} | {key / base:.2f} | "
              f"{statistics.median(x[2] for x in v):.2f} | {statistics.median(x[3] for x in v):.2f} | {len(v)} |")
PY
echo "# raw reports: $OUTDIR"
