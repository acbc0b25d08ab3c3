#!/usr/bin/env bash
# One round on the 16-core device (lent now and then, BENCHMARKS §1): the checks that
# need it, in one call of about 7 minutes, each part under its own time limit.
#
#   benches/scaling/device-round.sh POLLBOX_BIN OUT [SINK_BIN WRITER_BIN]
#
# Parts (DEVICE_PARTS picks some, in this order):
#   placement  8 workers, 8 closed-loop ingest connections: the kernel's hash against
#              placement by load (placement.sh), one build, interleaved
#   floor1     one worker on core 0, generators on cores of their own (ingest 8-11,
#              polls 14-15): idle, pollbox, sink, floor (floor.sh) at 570 k msg/s
#   seed       the seed's shape on 8 workers (seed.sh) at 0 and 1.2 M msg/s, hash and
#              load interleaved, jitter.c on cores 12-13 as a witness
#   floor8     floor.sh's idle, floor and sink modes on 8 workers at 1.2 M msg/s
#   snapshot   benches/snapshot/run.sh and floor.sh, 2 pairs each
# Each part's output goes to OUT/<part>.txt; the raw folders to OUT/raw.tgz.
set -u
[[ $# -ge 2 ]] || { echo "usage: $0 POLLBOX_BIN OUT [SINK_BIN WRITER_BIN]" >&2; exit 2; }
BIN=$(realpath "$1")
OUT=$(realpath -m "$2")
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 1
RAW=$(mktemp -d /tmp/pollbox-device.XXXXXX)
SINK=${3:-}
WRITER=${4:-}
[[ -n $SINK ]] || { SINK=$RAW/sink; cc -O2 -pthread -o "$SINK" benches/scaling/sink.c; }
[[ -n $WRITER ]] || { WRITER=$RAW/writer; cc -O2 -o "$WRITER" benches/snapshot/writer.c; }
SINK=$(realpath "$SINK")
WRITER=$(realpath "$WRITER")
# jitter.c: built here, or a prebuilt one beside SINK_BIN.
JITTER=$(dirname "$SINK")/jitter
[[ -x $JITTER ]] || { JITTER=$RAW/jitter; cc -O2 -o "$JITTER" benches/scaling/jitter.c 2>/dev/null || JITTER=""; }
if ! command -v curl >/dev/null; then
    # benches/snapshot/run.sh asks curl for /healthz and /metrics: a stand-in.
    mkdir -p "$RAW/bin"
    cat >"$RAW/bin/curl" <<'PY'
#!/usr/bin/env python3
import sys, urllib.request
args = [a for a in sys.argv[1:] if not a.startswith("-")]
out = sys.argv[sys.argv.index("-o") + 1] if "-o" in sys.argv else None
args = [a for a in args if a != out]
try:
    body = urllib.request.urlopen(args[-1], timeout=2).read()
except Exception:
    sys.exit(7)
if out is None:
    sys.stdout.buffer.write(body)
PY
    chmod +x "$RAW/bin/curl"
    export PATH=$RAW/bin:$PATH
fi
PARTS=${DEVICE_PARTS:-placement floor1 seed floor8 snapshot}
echo "# device round: $(date -u +%FT%TZ), $(nproc) cores, $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), kernel $(uname -r); parts: $PARTS"

# part NAME LIMIT_S COMMAND...: run it under its limit, its output to OUT/NAME.txt,
# and show its result lines.
part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name $(date -u +%T)"
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "rc $?"
    grep -E '^(\||hash |load |ingest |idle |pollbox |sink |floor |pair |none |writes |snapshots |median |# (machine|jitter))' "$OUT/$name.txt" | tail -n 40
}

for p in $PARTS; do
    case $p in
        placement)
            part placement 90 env PLACE_POLLBOX="$BIN" PLACE_WORKERS=8 PLACE_CONNECTIONS=8 \
                PLACE_SERVER_CPUS=0-7 PLACE_LOAD_CPUS=8-15 PLACE_DURATION=6 PLACE_REPS=2 \
                PLACE_OUT="$RAW/placement" bash benches/scaling/placement.sh
            ;;
        floor1)
            part floor1 130 env FLOOR_BIN="$BIN" FLOOR_SINK="$SINK" FLOOR_WORKERS=1 FLOOR_SERVER_CPUS=0 \
                FLOOR_INGEST_CPUS=8-11 FLOOR_POLL_CPUS=14-15 FLOOR_RATE=570000 FLOOR_REPS=2 \
                FLOOR_DURATION=7 FLOOR_OUT="$RAW/floor1" bash benches/scaling/floor.sh
            ;;
        seed)
            : >"$OUT/seed.txt"
            for rep in 1 2; do
                for mode in hash load; do
                    echo "== seed $mode rep $rep $(date -u +%T)" >>"$OUT/seed.txt"
                    timeout 60 env SCALE_PLACEMENT=$mode SEED_POLLBOX="$BIN" SEED_WORKERS=8 \
                        SEED_INGEST_CPUS=8-11 SEED_POLL_CPUS=14-15 SEED_INGEST_RATES="0 1200000" SEED_REPS=1 \
                        SEED_DURATION=7 ${JITTER:+SEED_JITTER_CPUS=12,13 SEED_JITTER_BIN=$JITTER} \
                        SEED_OUT="$RAW/seed-$mode-r$rep" bash benches/scaling/seed.sh >>"$OUT/seed.txt" 2>&1
                done
            done
            echo "== seed $(date -u +%T)"
            grep -E '^(== seed|ingest |\| [0-9])' "$OUT/seed.txt"
            ;;
        floor8)
            part floor8 80 env FLOOR_BIN="$BIN" FLOOR_SINK="$SINK" FLOOR_WORKERS=8 FLOOR_SERVER_CPUS=0-7 \
                FLOOR_INGEST_CPUS=8-11 FLOOR_POLL_CPUS=14-15 FLOOR_RATE=1200000 FLOOR_REPS=1 \
                FLOOR_DURATION=7 FLOOR_MODES="idle floor sink" FLOOR_OUT="$RAW/floor8" bash benches/scaling/floor.sh
            ;;
        snapshot)
            part snapshot 150 env SNAP_BIN="$BIN" SNAP_REPS=2 SNAP_DURATION=10 SNAP_WORK="$RAW/snap" \
                bash benches/snapshot/run.sh
            part snapshot-floor 110 env SNAPF_BIN="$BIN" SNAPF_SINK="$SINK" SNAPF_WRITER="$WRITER" SNAPF_REPS=2 \
                SNAPF_DURATION=10 SNAPF_WORK="$RAW/snapf" bash benches/snapshot/floor.sh
            ;;
        *) echo "unknown part $p" >&2 ;;
    esac
done
rm -f "$RAW"/snap/*.snap* "$RAW"/snapf/*.snap* "$RAW"/snapf/*/*.snap* 2>/dev/null
tar -czf "$OUT/raw.tgz" -C "$RAW" --exclude=sink --exclude=writer --exclude=jitter --exclude=bin . 2>/dev/null
echo "# done $(date -u +%T)"
