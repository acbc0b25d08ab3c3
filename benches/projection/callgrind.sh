#!/usr/bin/env bash
# Instructions per message for each projection candidate (pollbox's scanner and
# the crates beside it), counted by callgrind: immune to the noise of a shared
# machine.
#
#   benches/projection/callgrind.sh [output-file]     # e.g. benches/projection/results/DATE-callgrind.txt
#
# Each candidate runs on each body twice, N and 2N times, in the criterion
# bench binary's one-candidate mode (PROJECTION_CALLGRIND=candidate:body:N);
# the difference of the two totals divided by N messages is the cost per
# message with setup and warm-up taken out.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-/dev/stdout}"

if ! command -v valgrind >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends valgrind >/dev/null
fi

# PROJECTION_BIN: a bench binary built elsewhere (e.g. a base commit's, for a
# before/after); CANDIDATES: which candidates to count (default: all five).
bin=${PROJECTION_BIN:-$(cargo bench -p pollbox-benches --bench projection --no-run 2>&1 \
  | sed -n 's/.*Executable [^ ]*projection\.rs (\(.*\))/\1/p' | tail -1)}
[[ -x "$bin" ]] || { echo "no bench binary" >&2; exit 1; }

instructions() { # candidate body iterations
  local log
  log=$(mktemp)
  PROJECTION_CALLGRIND="$1:$2:$3" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
    "$bin" >/dev/null 2>"$log"
  sed -n 's/.*Collected : *\([0-9]*\).*/\1/p' "$log"
  rm -f "$log"
}

{
  echo "# instructions per message (callgrind), $(date -u +%F), $(git rev-parse --short HEAD)${PROJECTION_BIN:+, binary $PROJECTION_BIN}"
  printf '%-18s' "candidate"
  bodies="512B 512B_fields_last 8KiB 8KiB_fields_last load_512B load_8KiB ndjson_32x512B"
  for b in $bodies; do printf '%18s' "$b"; done
  echo
  for c in ${CANDIDATES:-scanner simd_json_tape sonic_rs_iter serde_json_value serde_typed}; do
    printf '%-18s' "$c"
    for b in $bodies; do
      case $b in
        8KiB*) n=200 ;;
        ndjson*) n=20 ;;
        *) n=2000 ;;
      esac
      msgs=$n
      [[ $b == ndjson* ]] && msgs=$((n * 32))
      a=$(instructions "$c" "$b" "$n")
      z=$(instructions "$c" "$b" $((2 * n)))
      printf '%18s' "$(( (z - a) / msgs ))"
    done
    echo
  done
} | tee "$out"
