#!/usr/bin/env bash
# benches/snapshot/curve.sh [OUT_DIR]: the poll columns of the cost curve
# (BENCHMARKS.md, "Incremental snapshots"): benches/snapshot/run.sh at each size
# of CURVE_SIZES (100000 1000000 10000000), polls at 20 k/s with snapshots every
# 2 s against none, and 1 % of the boxes changing an interval in both modes
# (SNAP_CHANGE_RATE = boxes / 200). Each size's output to OUT_DIR/curve-<boxes>.txt
# (default: benches/snapshot/results/<date>-curve-<boxes>.txt).
# Knobs: CURVE_SIZES, CURVE_REPS ("2 2 1": runs per mode, by size), CURVE_LIMIT_S
# (each size's time limit, 200), and run.sh's (SNAP_BIN, SNAP_DURATION, SNAP_SETTLE).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT_DIR="${1:-$HERE/results}"
mkdir -p "$OUT_DIR"
read -r -a sizes <<<"${CURVE_SIZES:-100000 1000000 10000000}"
read -r -a reps <<<"${CURVE_REPS:-2 2 1}"
for i in "${!sizes[@]}"; do
  n=${sizes[i]}
  out="$OUT_DIR/$([[ $# -ge 1 ]] || date +%F-)curve-$n.txt"
  SNAP_KEYS=$n SNAP_CHANGE_RATE=$((n / 200)) SNAP_REPS=${reps[i]:-1} \
    timeout "${CURVE_LIMIT_S:-200}" "$HERE/run.sh" >"$out" 2>&1
  echo "== $n boxes (rc $?)"
  grep -E '^(mode|none|snapshots|median p50:|median p99:)' "$out" | grep -v '_ok='
done
