#!/usr/bin/env bash
# Polls while snapshots are written: 1,000,000 boxes, polls
# at 20 k/s open-loop, p50/p90/p99/p99.9 with `snapshot.interval_s = 2` against
# the same server without snapshots. The server (and its snapshot thread) is
# pinned to core 0, the generator to core 1; the two modes alternate.
#
#   benches/snapshot/run.sh            # prints a table, raw JSON in $SNAP_WORK
#
# Knobs: SNAP_KEYS (1000000), SNAP_RATE (20000), SNAP_DURATION (s, 20),
# SNAP_SETTLE (s between the pre-seed and the measurement, 8: jemalloc purges the
# pre-seed's dirty pages within its 5 s decay), SNAP_REPS (runs per mode, 3), SNAP_BIN (pollbox binary; default: build release),
# SNAP_WORK (raw data folder), SNAP_NICE (-10 as root: the server and the
# generator ahead of anything else the machine runs), SNAP_CHANGE_RATE (ingests/s
# into the same keys during the measurement, in both modes, from a second generator
# on core 1; 0: none, so incremental snapshots have nothing to write after the first
# base; 5000 changes about 1 % of 1,000,000 boxes per 2 s interval).
set -euo pipefail
cd "$(dirname "$0")/../.."
KEYS=${SNAP_KEYS:-1000000}
RATE=${SNAP_RATE:-20000}
DUR=${SNAP_DURATION:-20}
REPS=${SNAP_REPS:-3}
WORK=${SNAP_WORK:-$(mktemp -d /tmp/pollbox-snap.XXXXXX)}
mkdir -p "$WORK"
if [[ -z ${SNAP_BIN:-} ]]; then
    cargo build --release -q -p pollbox
    SNAP_BIN=target/release/pollbox
fi
if [[ $(id -u) == 0 ]]; then NICE=${SNAP_NICE:--10}; else NICE=${SNAP_NICE:-0}; fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {
    local mode=$1 rep=$2 port cfg pid
    port=$(free_port)
    cfg=$WORK/$mode.toml
    rm -f "$WORK"/boxes.snap*
    # Room for every key (the default max_boxes is 1,000,000).
    printf '[boxes]\nmax_boxes = %d\n' "$((KEYS > 1000000 ? KEYS : 1000000))" >"$cfg"
    if [[ $mode == snapshots ]]; then
        printf '[snapshot]\npath = "%s"\ninterval_s = 2\n' "$WORK/boxes.snap" >>"$cfg"
    fi
    taskset -c 0 nice -n "$NICE" "$SNAP_BIN" serve --config "$cfg" --listen "127.0.0.1:$port" --workers 1 \
        2>"$WORK/$mode-$rep.log" &
    pid=$!
    for _ in $(seq 100); do
        curl -s -o /dev/null "http://127.0.0.1:$port/healthz" && break
        sleep 0.1
    done
    # 1,000,000 boxes, then let a snapshot or two happen before measuring.
    taskset -c 1 "$SNAP_BIN" load --url "http://127.0.0.1:$port" --preseed --keys "$KEYS" \
        --mix poll:100 --duration 1s --quiet >/dev/null
    sleep "${SNAP_SETTLE:-8}"
    local changer=
    if ((${SNAP_CHANGE_RATE:-0} > 0)); then
        taskset -c 1 "$SNAP_BIN" load --url "http://127.0.0.1:$port" --keys "$KEYS" --mix ingest:100 \
            --rate "$SNAP_CHANGE_RATE" --connections 4 --duration "$((DUR + 2))s" --quiet >/dev/null &
        changer=$!
    fi
    taskset -c 1 nice -n "$NICE" "$SNAP_BIN" load --url "http://127.0.0.1:$port" --keys "$KEYS" --mix poll:100 \
        --rate "$RATE" --connections 32 --duration "${DUR}s" --quiet \
        --json "$WORK/$mode-$rep.json" >/dev/null
    [[ -z $changer ]] || wait "$changer" || true
    local snaps
    snaps=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^pollbox_snapshots_total / {print $2}')
    echo "$mode $rep snapshots_ok=${snaps:-?} $(curl -s "http://127.0.0.1:$port/metrics" | grep -E '^pollbox_snapshot_(written_bytes|bases)_total ' | tr '\n' ' ')" >>"$WORK/snapshots.txt"
    kill -INT "$pid"
    wait "$pid" || true
}

echo "pollbox snapshot stall: $KEYS boxes, polls at $RATE/s for ${DUR}s, ${SNAP_CHANGE_RATE:-0} ingests/s beside them, $REPS runs per mode, $(uptime)"
for rep in $(seq "$REPS"); do
    run none "$rep"
    run snapshots "$rep"
done
python3 benches/snapshot/summary.py "$WORK" "$REPS" none snapshots
cat "$WORK/snapshots.txt"
echo "raw data: $WORK"
