#!/usr/bin/env bash
# Two builds side by side in the seed's shape on one worker (BENCHMARKS §6, "Polls
# beside ingest on one worker"): poll latency with and without batch ingest beside
# it, then batch ingest at saturation, the builds interleaved rep by rep.
#
#   benches/scaling/seed-ab.sh BASE_BIN NEW_BIN    # e.g. a worktree's target/release/pollbox
#
# Knobs: AB_REPS (3), AB_RATES (ingest msg/s, "0 600000"); the server on CPU 0, both
# generators on CPU 1 (a 2-core machine). Prints the seed.sh lines and the saturation
# figures; raw reports stay under $AB_OUT (a temp folder by default).
set -u
cd "$(dirname "$0")/../.." || exit 1
[[ $# == 2 ]] || { echo "usage: $0 BASE_BIN NEW_BIN" >&2; exit 2; }
declare -A BIN=([base]=$1 [new]=$2)
OUT=${AB_OUT:-$(mktemp -d /tmp/pollbox-seed-ab.XXXXXX)}
for rep in $(seq "${AB_REPS:-3}"); do
    for which in base new; do
        echo "== $which rep $rep"
        SEED_POLLBOX=${BIN[$which]} SEED_WORKERS=1 SEED_SERVER_CPUS=0 SEED_INGEST_CPUS=1 \
            SEED_POLL_CPUS=1 SEED_INGEST_RATES="${AB_RATES:-0 600000}" SEED_REPS=1 \
            SEED_OUT="$OUT/$which-r$rep" bash benches/scaling/seed.sh 2>&1 | grep -E "^ingest|^# "
    done
done
echo "# batch ingest at saturation: pollbox load -c 64 --pipeline 4 --mix batch:100 --batch-size 100 --body-bytes 512 --keys 1000 -d 8s --warmup 2s"
port=19500
for rep in $(seq "${AB_REPS:-3}"); do
    for which in base new; do
        port=$((port + 1))
        taskset -c 0 "${BIN[$which]}" serve --listen "127.0.0.1:$port" --workers 1 2>/dev/null &
        srv=$!
        sleep 0.5
        taskset -c 1 "${BIN[$which]}" load --url "http://127.0.0.1:$port" -c 64 --pipeline 4 \
            --mix batch:100 --batch-size 100 --body-bytes 512 --keys 1000 -d 8s --warmup 2s -q \
            --json "$OUT/sat-$which-$rep.json" >/dev/null 2>&1
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"$which rep $rep: {d['messages_per_s']:.0f} msg/s, errors {d['errors_total']}\")" "$OUT/sat-$which-$rep.json"
        kill "$srv"; wait "$srv" 2>/dev/null
    done
done
echo "# raw reports: $OUT"
