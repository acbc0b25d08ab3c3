#!/usr/bin/env bash
# The floor under benches/snapshot/run.sh: its shape (polls at 20 k/s open-loop over 32
# connections on 1,000,000 keys, the generator on core 1, measured 20 s) with no
# pollbox. The polls go to benches/scaling/sink.c (1 thread on core 0), and the
# "snapshot" is benches/snapshot/writer.c at nice 19 on core 0: every 2 s a file of
# pollbox's snapshot size written as pollbox writes one (temp file, fsync, rename, fsync
# the folder), without the walk of the boxes. Modes `none` and `writes` alternate; what
# the writes do to the polls here is what the machine's file I/O costs alone.
#
#   benches/snapshot/floor.sh                            # the disk under /tmp
#   SNAPF_WORK=/dev/shm/pollbox-snapf benches/snapshot/floor.sh   # tmpfs
#
# Knobs: SNAPF_REPS (pairs, 3), SNAPF_DURATION (s, 20), SNAPF_SETTLE (s between the
# pre-seed and the measurement, 8, as run.sh), SNAPF_BYTES (file size; default measured:
# the snapshot pollbox writes at shutdown after `load --preseed --keys 1000000`),
# SNAPF_CHUNK (bytes per write(), 65536: pollbox's BufWriter), SNAPF_WORK (the folder
# the file is written in, and the raw data), SNAPF_BIN (pollbox binary, for the
# generator; default: build release), SNAPF_SINK and SNAPF_WRITER (prebuilt sink.c and
# writer.c; default: built with cc), SNAPF_NICE (-10 as root: the sink and the
# generator ahead of anything else the machine runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
KEYS=1000000
RATE=20000
DUR=${SNAPF_DURATION:-20}
REPS=${SNAPF_REPS:-3}
WORK=${SNAPF_WORK:-$(mktemp -d /tmp/pollbox-snapf.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [[ -z ${SNAPF_BIN:-} ]]; then
    cargo build --release -q -p pollbox
    SNAPF_BIN=target/release/pollbox
fi
if [[ $(id -u) == 0 ]]; then NICE=${SNAPF_NICE:--10}; else NICE=${SNAPF_NICE:-0}; fi
# The binaries apart from WORK: /dev/shm is often mounted noexec.
BINS=$(mktemp -d /tmp/pollbox-snapf-bin.XXXXXX)
# SNAPF_SINK / SNAPF_WRITER: prebuilt binaries (a machine without cc).
if [[ -n ${SNAPF_SINK:-} ]]; then cp "$SNAPF_SINK" "$BINS/sink"; else cc -O2 -pthread -o "$BINS/sink" benches/scaling/sink.c; fi
if [[ -n ${SNAPF_WRITER:-} ]]; then cp "$SNAPF_WRITER" "$BINS/writer"; else cc -O2 -o "$BINS/writer" benches/snapshot/writer.c; fi
ulimit -n 65536 2>/dev/null || true
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_ready PORT: until something accepts there.
# shellcheck source=benches/scaling/lib.sh
. benches/scaling/lib.sh
preseed() {
    taskset -c 1 "$SNAPF_BIN" load --url "http://127.0.0.1:$1" --preseed --keys "$KEYS" \
        --mix poll:100 --duration 1s --quiet >/dev/null
}

# The size of pollbox's snapshot of 1,000,000 pre-seeded boxes: the one it writes as it stops.
if [[ -z ${SNAPF_BYTES:-} ]]; then
    mkdir -p "$WORK/measure"
    printf '[snapshot]\npath = "%s"\ninterval_s = 2\n' "$WORK/measure/boxes.snap" >"$WORK/measure/pollbox.toml"
    port=$(free_port)
    taskset -c 0 "$SNAPF_BIN" serve --config "$WORK/measure/pollbox.toml" --listen "127.0.0.1:$port" --workers 1 \
        2>"$WORK/measure/pollbox.log" &
    pid=$!
    wait_ready "$port"
    preseed "$port"
    kill -INT "$pid"
    wait "$pid" || true
    SNAPF_BYTES=$(stat -c %s "$WORK/measure/boxes.snap")
    rm -rf "$WORK/measure"
fi
CHUNK=${SNAPF_CHUNK:-65536}

run() {
    local mode=$1 rep=$2 port sink writer=""
    port=$(free_port)
    rm -f "$WORK/boxes.snap" "$WORK/boxes.snap.tmp"
    taskset -c 0 nice -n "$NICE" "$BINS/sink" "$port" 1 2>"$WORK/$mode-$rep.sink.log" &
    sink=$!
    wait_ready "$port"
    if [[ $mode == writes ]]; then
        taskset -c 0 nice -n 19 "$BINS/writer" "$WORK/boxes.snap" "$SNAPF_BYTES" 2 "$CHUNK" \
            >"$WORK/$mode-$rep.writes" &
        writer=$!
    fi
    preseed "$port"
    sleep "${SNAPF_SETTLE:-8}"
    local before=0
    [[ -z $writer ]] || before=$(wc -l <"$WORK/$mode-$rep.writes")
    taskset -c 1 nice -n "$NICE" "$SNAPF_BIN" load --url "http://127.0.0.1:$port" --keys "$KEYS" --mix poll:100 \
        --rate "$RATE" --connections 32 --duration "${DUR}s" --quiet \
        --json "$WORK/$mode-$rep.json" >/dev/null || true
    if [[ -n $writer ]]; then
        kill "$writer"
        wait "$writer" 2>/dev/null || true
        # The writes that ended during the measurement, and their median length.
        tail -n +"$((before + 1))" "$WORK/$mode-$rep.writes" | awk '{print $3}' | sort -n |
            awk -v m="$mode" -v r="$rep" '{ms[NR] = $1} END {
                printf "%s %s writes=%d median_ms=%.1f\n", m, r, NR, NR ? ms[int((NR + 1) / 2)] : 0}' >>"$WORK/writes.txt"
    fi
    kill "$sink"
    wait "$sink" 2>/dev/null || true
    rm -f "$WORK/boxes.snap" "$WORK/boxes.snap.tmp"
}

echo "pollbox snapshot floor: sink + writer, $KEYS keys, polls at $RATE/s for ${DUR}s, $REPS pairs," \
    "files of $SNAPF_BYTES B in $CHUNK B writes every 2 s in $WORK ($(df -T "$WORK" | awk 'NR == 2 {print $2}')), $(uptime)"
: >"$WORK/writes.txt"
for rep in $(seq "$REPS"); do
    run none "$rep"
    run writes "$rep"
done
python3 benches/snapshot/summary.py "$WORK" "$REPS" none writes
cat "$WORK/writes.txt"
rm -rf "$BINS"
echo "raw data: $WORK"
