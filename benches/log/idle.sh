#!/usr/bin/env bash
# What an idle node costs: a node of a log with nothing to do (its topic
# quiet, no client) beside a standalone node, side by side, each on
# LOG_NODE_CPU; CPU from /proc/PID/stat over IDLE_DURATION, as % of one core,
# and per thread (by the names `ps -T` shows), so the thread that burns is
# named.
#
#   benches/log/idle.sh              # results/DATE-idle.txt
#
# Knobs: IDLE_DURATION (30 s), IDLE_REPS (3), IDLE_PARTITIONS (4); lib.sh's
# LOG_* knobs (LOG_CLIENT: extra [log.client] lines for the log node).
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
DUR=${IDLE_DURATION:-30}
REPS=${IDLE_REPS:-3}
PARTS=${IDLE_PARTITIONS:-4}
OUT=$RESULTS/$(date -u +%F)-idle.txt
build
broker_up
quiet
header "$OUT" "IDLE_DURATION=$DUR IDLE_REPS=$REPS IDLE_PARTITIONS=$PARTS LOG_CLIENT='${LOG_CLIENT:-}' benches/log/idle.sh"

TOPIC=idle-$$
topic_create "$TOPIC" "$PARTS"
node_up standalone 19301
SA=$NODE_PID
node_up log 19302 "$TOPIC"
LG=$NODE_PID
wait_ready 19302 60
sleep 3 # past the start's own work

# Per-thread ticks of PID as "name ticks" lines (threads of one name summed).
threads() {
  local t
  for t in /proc/"$1"/task/*; do
    printf '%s %s\n' "$(tr ' ' '_' <"$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")"
  done | awk '{s[$1] += $2} END {for (n in s) print n, s[n]}' | sort
}

for rep in $(seq "$REPS"); do
  a0=$(ticks "$SA"); l0=$(ticks "$LG"); b0=$(ticks "$BROKER_PID")
  threads "$LG" >"$WORK/t0"
  sleep "$DUR"
  a1=$(ticks "$SA"); l1=$(ticks "$LG"); b1=$(ticks "$BROKER_PID")
  threads "$LG" >"$WORK/t1"
  python3 - "$rep" "$DUR" "$HZ" "$((a1 - a0))" "$((l1 - l0))" "$((b1 - b0))" "$WORK/t0" "$WORK/t1" <<'PY' | tee -a "$OUT"
import sys
rep, dur, hz, sa, lg, br = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), *map(int, sys.argv[4:7])
pct = lambda t: 100.0 * t / hz / dur
def load(p):
    return dict((l.split()[0], int(l.split()[1])) for l in open(p) if l.strip())
t0, t1 = load(sys.argv[7]), load(sys.argv[8])
busy = sorted(((t1[n] - t0.get(n, 0), n) for n in t1), reverse=True)
per = ", ".join(f"{n} {pct(t):.2f}" for t, n in busy if t > 0) or "none"
print(f"rep {rep}: standalone {pct(sa):.2f} % of a core, log node {pct(lg):.2f} %, "
      f"ratio {(lg / sa) if sa else float('inf'):.1f}x; broker {pct(br):.2f} %; "
      f"log node by thread (%): {per}")
PY
done
