#!/usr/bin/env bash
# Restart time with the write-ahead file replayed against a restart from a
# snapshot alone holding the same boxes, alternated in one run.
#  1. fill: one node with [wal] and a snapshot interval of a day (so no segment is
#     deleted), RESTART_BOXES boxes pre-seeded, then batch ingest of 512 B messages
#     on those keys until the file holds RESTART_WAL_BYTES; then kill -9 (a crash:
#     the file is the only copy of what was acknowledged).
#  2. its data folder copied; the copy started once and stopped gracefully: the
#     final snapshot holds every box and the segments it covers are deleted but
#     the newest; with RESTART_KEEP_NEWEST=0 (the default) that one is removed too
#     (the snapshot covers it: a snapshot alone), with 1 it stays (what a restart
#     after a graceful stop reads).
#  3. rounds, alternated: `replay` starts the crashed node's folder (snapshot: none
#     or an old one; the file replayed) and `snapshot` the copy's (the snapshot,
#     the newest segment or none); each timed from the process's start to /readyz 200, the
#     process's CPU over it; then kill -9 (`replay`: nothing written, the next round
#     replays the same file) or SIGTERM (`snapshot`: the seal kept, as after a
#     graceful stop). Both with the same config ([wal] on, one worker on SERVER_CPU).
# The files are in the page cache (just written or read); RESTART_DROP_CACHES=1
# drops the caches before each start (echo 3 > /proc/sys/vm/drop_caches).
#
#   benches/wal/restart.sh          # results/DATE-restart.txt
#
# Knobs: RESTART_BOXES (1000000), RESTART_WAL_BYTES (1000000000), RESTART_REPS (3),
# RESTART_DROP_CACHES (0), RESTART_KEEP_NEWEST (0), RESTART_FILL_STEP_S (3), WAL_TAG;
# lib.sh's WAL_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
BOXES=${RESTART_BOXES:-1000000}
TARGET=${RESTART_WAL_BYTES:-1000000000}
REPS=${RESTART_REPS:-3}
DROP=${RESTART_DROP_CACHES:-0}
KEEP=${RESTART_KEEP_NEWEST:-0}
STEP=${RESTART_FILL_STEP_S:-3}
OUT=$RESULTS/$(date -u +%F)-restart${WAL_TAG:+-$WAL_TAG}.txt
export WAL_SNAPSHOT_S=86400
build
header "$OUT" "RESTART_BOXES=$BOXES RESTART_WAL_BYTES=$TARGET RESTART_REPS=$REPS RESTART_DROP_CACHES=$DROP RESTART_KEEP_NEWEST=$KEEP RESTART_FILL_STEP_S=$STEP benches/wal/restart.sh"

PORT=19321
node_up replay $PORT wal
wait_ready $PORT replay 60
FILL=(--mix batch:100 --batch-size 100 --body-bytes 512 --keys "$BOXES" -c 16 -q --max-error-rate 0)
echo "# fill: pollbox load ${FILL[*]} --preseed -d 1s, then -d ${STEP}s until pollbox_wal_disk_bytes >= $TARGET" | tee -a "$OUT"
t0=$SECONDS
taskset -c "$LOAD_CPU" "$POLLBOX" load --url "http://127.0.0.1:$PORT" "${FILL[@]}" --preseed -d 1s >"$WORK/fill.txt" 2>&1 \
  || { cat "$WORK/fill.txt"; exit 1; }
while (( $(metric $PORT pollbox_wal_disk_bytes | cut -d. -f1) < TARGET )); do
  taskset -c "$LOAD_CPU" "$POLLBOX" load --url "http://127.0.0.1:$PORT" "${FILL[@]}" -d "${STEP}s" >"$WORK/fill.txt" 2>&1 \
    || { cat "$WORK/fill.txt"; exit 1; }
done
{
  echo "fill: $((SECONDS - t0)) s; boxes $(metric $PORT pollbox_boxes); records $(metric $PORT pollbox_wal_records_total);" \
    "wal bytes on disk $(metric $PORT pollbox_wal_disk_bytes) in $(metric $PORT pollbox_wal_segments) segments"
} | tee -a "$OUT"
node_down "$NODE_PID" KILL

cp -a "$WORK/replay" "$WORK/snapshot"
node_up snapshot $PORT wal
wait_ready $PORT snapshot 600
echo "# the copy: boxes $(metric $PORT pollbox_boxes) after its replay; stopped gracefully (final snapshot)" | tee -a "$OUT"
node_down "$NODE_PID" TERM
if [[ "$KEEP" != 1 ]]; then
  echo "# removed from the copy, covered by its snapshot: $(cd "$WORK/snapshot/wal" && ls)" | tee -a "$OUT"
  rm -f "$WORK/snapshot/wal/"*.log
fi

sizes() { # NAME: bytes of the snapshot files and of the segments
  local s w
  s=$(find "$WORK/$1" -maxdepth 1 -name 'boxes.snap*' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  w=$(find "$WORK/$1/wal" -name '*.log' -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}')
  echo "$s $w"
}
for n in replay snapshot; do
  echo "# $n folder: $(find "$WORK/$n" -type f -printf '%P %s\n' | sort | tr '\n' ' ')" | tee -a "$OUT"
done

one() { # NAME REP
  local name=$1 t0 t1 cpu boxes s w how=KILL
  [[ "$name" == snapshot ]] && how=TERM
  if [[ "$DROP" == 1 ]]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi
  read -r s w < <(sizes "$name")
  node_up "$name" $PORT wal
  t0=$NODE_T0
  wait_ready $PORT "$name" 900
  t1=$(now)
  cpu=$(ticks "$NODE_PID")
  boxes=$(metric $PORT pollbox_boxes)
  node_down "$NODE_PID" "$how"
  python3 - "$name" "$2" "$t0" "$t1" "$cpu" "$HZ" "$boxes" "$s" "$w" <<'PY'
import sys
name, rep, t0, t1, cpu, hz, boxes, s, w = sys.argv[1:]
secs = float(t1) - float(t0); gb = (int(s) + int(w)) / 1e9
print(f"{name:9s} rep {rep}  ready in {secs:.3f} s  CPU {int(cpu) / int(hz):.2f} s  boxes {float(boxes):,.0f}  "
      f"snapshot {int(s) / 1e9:.3f} GB + wal {int(w) / 1e9:.3f} GB = {gb:.3f} GB read  {secs / gb:.2f} s per GB")
PY
}

for rep in $(seq 1 "$REPS"); do
  {
    one replay "$rep"
    one snapshot "$rep"
    contention
  } | tee -a "$OUT"
done
echo "# the last start's log: $(tail -3 "$WORK/replay.log" | tr '\n' ' ' | cut -c1-600)" | tee -a "$OUT"

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+rep \d+\s+ready in (\S+) s\s+CPU (\S+) s.*snapshot (\S+) GB \+ wal (\S+) GB", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[i]) for i in range(2, 6)])
med = {k: [st.median(c) for c in zip(*v)] for k, v in rows.items()}
r, s = med["replay"], med["snapshot"]
print(f"# medians: replay {r[0]:.2f} s (CPU {r[1]:.2f} s) for snapshot {r[2]:.3f} GB + wal {r[3]:.3f} GB: "
      f"{r[0] / (r[2] + r[3]):.2f} s (CPU {r[1] / (r[2] + r[3]):.2f} s) per GB read; "
      f"{(r[0] - s[0]) / r[3]:.2f} s (CPU {(r[1] - s[1]) / r[3]:.2f} s) per GB of wal beyond the snapshot restart")
print(f"# medians: snapshot {s[0]:.2f} s (CPU {s[1]:.2f} s) for snapshot {s[2]:.3f} GB + wal {s[3]:.6f} GB: "
      f"{s[0] / (s[2] + s[3]):.2f} s (CPU {s[1] / (s[2] + s[3]):.2f} s) per GB read")
print(f"# replay / snapshot restart time: {r[0] / s[0]:.2f} (by round " + ", ".join(f"{a[0] / b[0]:.2f}" for a, b in zip(rows["replay"], rows["snapshot"])) + ")")
PY
echo "# raw: $OUT"
