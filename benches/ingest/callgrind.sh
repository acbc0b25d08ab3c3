#!/usr/bin/env bash
# Instructions per ingested message in the server (callgrind: stable under the
# noise of a shared machine), for batch ingest as benches/ingest/run.sh drives
# it, one build or a base build and this tree's side by side:
#
#   benches/ingest/callgrind.sh                           # this tree's build
#   INGEST_BEFORE=/path/to/old/pollbox benches/ingest/callgrind.sh
#
# Knobs: INGEST_SIZES ("512 8192"), INGEST_DURATION (s of load, 8),
# INGEST_BATCH (100), INGEST_KEYS (1000). The server runs under callgrind with
# one worker; `pollbox load` (this tree's) sends batches on 2 connections x
# pipeline 2 for the duration. Per message: the instructions of the worker's
# `Worker::read` (`worker/settle.rs`; in older builds `worker.rs`; inclusive: reading,
# framing, projection, apply, answers)
# divided by the messages the server accepted (its /metrics), and the same
# for the projection (`Projector::project`), the apply (`BoxTable::apply`, or `apply_stamped` where `apply` is inlined into it)
# and the read buffer's growth (`Connection::make_room`; its impl block lives in
# `conn/read_buffer.rs` now, so its symbol reads `<impl ...Connection>::make_room`).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZES=${INGEST_SIZES:-512 8192}
DUR=${INGEST_DURATION:-8}
BATCH=${INGEST_BATCH:-100}
KEYS=${INGEST_KEYS:-1000}
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
cargo build --release -q -p pollbox
NOW=$PWD/target/release/pollbox
declare -A BIN=([now]=$NOW)
builds="now"
if [[ -n ${INGEST_BEFORE:-} ]]; then BIN[before]=$INGEST_BEFORE; builds="before now"; fi
WORK=$(mktemp -d /tmp/pollbox-ingest-cg.XXXXXX)
port=18870
echo "# benches/ingest/callgrind.sh: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty'),"
echo "# batch $BATCH, load ${DUR}s, $KEYS keys; raw: $WORK"
printf "%-7s %6s %9s %12s %12s %10s %10s\n" build size messages "read/msg" "project/msg" "apply/msg" "room/msg"
for size in $SIZES; do
  for b in $builds; do
    port=$((port + 1))
    out=$WORK/$b-$size.cg
    valgrind --tool=callgrind --callgrind-out-file="$out" "${BIN[$b]}" serve \
      --listen 127.0.0.1:$port --workers 1 >"$WORK/$b-$size.server.log" 2>&1 &
    srv=$!
    for _ in $(seq 150); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
    "$NOW" load --url "http://127.0.0.1:$port" --mix batch:100 --batch-size "$BATCH" \
      --body-bytes "$size" -c 2 --pipeline 2 --keys "$KEYS" -d "${DUR}s" >"$WORK/$b-$size.load.txt" 2>&1
    msgs=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^pollbox_ingest_messages_total\{result="accepted"\}/ {print $2}')
    kill -INT $srv
    wait $srv || true
    callgrind_annotate --inclusive=yes "$out" >"$out.txt" 2>/dev/null
    python3 - "$out.txt" "$b" "$size" "$msgs" <<'PY'
import re, sys
path, build, size, msgs = sys.argv[1], sys.argv[2], sys.argv[3], int(float(sys.argv[4]))
# A function's inclusive cost appears on several lines, one per source file
# its inlined code came from; the largest is the whole call (the cost of the
# calls into it), the others are parts of it.
want = {"read": r"worker::(settle::<impl pollbox_server::worker::)?Worker>?::read( |$)", "project": r"Projector::project( |$)",
        "apply": r"BoxTable::apply(_stamped)?( |$)", "room": r"Connection>?::make_room( |$)"}
got = {k: 0 for k in want}
for line in open(path):
    m = re.match(r"\s*([\d,]+) ", line)
    if not m:
        continue
    for k, pat in want.items():
        if re.search(pat, line):
            got[k] = max(got[k], int(m.group(1).replace(",", "")))
per = {k: v / max(msgs, 1) for k, v in got.items()}
print(f"{build:7s} {size:>6s} {msgs:9d} {per['read']:12,.0f} {per['project']:12,.0f} {per['apply']:10,.0f} {per['room']:10,.0f}")
PY
  done
done
