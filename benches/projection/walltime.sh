#!/usr/bin/env bash
# Native time per message of the projection in two or more bench binaries,
# alternated round by round on one core: the median and the fastest round of
# each. Callgrind counts instructions; this shows what the CPU makes of them
# (fewer instructions can be slower: BENCHMARKS.md, "Tried, not kept").
#
#   benches/projection/walltime.sh BODY N ROUNDS BIN...
#
# BODY: a body of the projection bench (512B, 8KiB, load_512B, load_8KiB,
# ...); N: messages per round; BIN: bench binaries, e.g. built with
# `cargo bench -p pollbox-benches --bench projection --no-run` at two
# commits. Each round runs `PROJECTION_CALLGRIND=scanner:BODY:N BIN` pinned
# to CPU ${WALLTIME_CPU:-1} and divides its wall time by N.
set -euo pipefail
body=$1 n=$2 rounds=$3
shift 3
cpu=${WALLTIME_CPU:-1}
declare -A times
for _ in $(seq "$rounds"); do
  for bin in "$@"; do
    start=$(date +%s%N)
    PROJECTION_CALLGRIND="scanner:$body:$n" taskset -c "$cpu" "$bin" >/dev/null
    end=$(date +%s%N)
    times[$bin]+=" $(((end - start) / n))"
  done
done
echo "# $body, $n messages a round, $rounds rounds alternated on CPU $cpu; ns a message"
for bin in "$@"; do
  read -r -a t <<<"${times[$bin]}"
  mapfile -t s < <(printf '%s\n' "${t[@]}" | sort -n)
  echo "$bin: median ${s[$((${#s[@]} / 2))]} fastest ${s[0]} rounds${times[$bin]}"
done
