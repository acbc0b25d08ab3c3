#!/usr/bin/env bash
# Where a replay's CPU goes: `perf record` (cpu-clock: this VM has no
# hardware counters) of `pollbox serve` replaying PERF_RECORDS records until
# /readyz is 200, and of the bare consumer reading the same topic; the top
# symbols of each, and pollbox's samples grouped by what they do.
#
#   benches/log/perf.sh              # results/DATE-perf.txt
#
# Knobs: PERF_RECORDS (4000000); lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
RECORDS=${PERF_RECORDS:-4000000}
OUT=$RESULTS/$(date -u +%F)-perf.txt
build
broker_up
TOPIC=perf-$$
topic_create "$TOPIC" 4
"$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$TOPIC" --records "$RECORDS" >/dev/null
taskset -c "$NODE_CPU" "$LOGBENCH" consume --brokers "$BOOTSTRAP" --topic "$TOPIC" >/dev/null # page cache
quiet
header "$OUT" "PERF_RECORDS=$RECORDS benches/log/perf.sh"

printf '[server]\nlisten = "127.0.0.1:19690"\nworkers = 1\n[log]\nbrokers = "%s"\ntopic = "%s"\nallow_unsafe_topic = true\n' \
  "$BOOTSTRAP" "$TOPIC" >"$WORK/node.toml"
taskset -c "$NODE_CPU" perf record -q -F 999 -g -o "$WORK/pollbox.data" \
  "$POLLBOX" serve --config "$WORK/node.toml" >"$WORK/node.log" 2>&1 &
rec=$!
STARTED_PIDS+=("$rec")
until curl -sf http://127.0.0.1:19690/readyz >/dev/null 2>&1; do sleep 0.05; done
kill -TERM "$(pgrep -P "$rec")"
wait "$rec" || true
taskset -c "$NODE_CPU" perf record -q -F 999 -g -o "$WORK/bare.data" \
  "$LOGBENCH" consume --brokers "$BOOTSTRAP" --topic "$TOPIC" >>"$OUT"

for who in pollbox bare; do
  perf report -i "$WORK/$who.data" --no-children --sort comm,dso -g none -q >"$WORK/$who.threads" 2>/dev/null
  perf report -i "$WORK/$who.data" --no-children --sort sym -g none -q >"$WORK/$who.syms" 2>/dev/null
done
{
  for who in pollbox bare; do
    echo
    echo "## $who: samples by thread and object"
    sed -n 1,8p "$WORK/$who.threads"
    echo "## $who: top symbols"
    sed -n 1,25p "$WORK/$who.syms"
  done
  echo
  echo "## pollbox: samples grouped (symbol patterns in perf.sh)"
  python3 -c '
import re, sys
groups = [("projection (pollbox_core::projection)", r"projection"),
          ("box table (pollbox_core::boxes, epoch)", r"boxes|crossbeam_epoch|seqlock"),
          ("librdkafka (rd_*)", r"\brd_|rdkafka"),
          ("malloc and free (libc)", r"malloc|calloc|free|unlink_chunk|realloc"),
          ("locks (pthread mutex)", r"pthread_mutex|futex"),
          ("clock_gettime", r"clock_gettime"),
          ("kernel", r"\[k\]")]
tot = {g: 0.0 for g, _ in groups}; other = 0.0
for line in sys.stdin:
    m = re.match(r"\s*([\d.]+)%\s+(.*)", line)
    if not m: continue
    pct, sym = float(m[1]), m[2]
    for g, pat in groups:
        if re.search(pat, sym): tot[g] += pct; break
    else: other += pct
for g, _ in groups: print(f"{tot[g]:6.2f}%  {g}")
print(f"{other:6.2f}%  other")
' <"$WORK/pollbox.syms"
} | tee -a "$OUT"
echo "# raw: $OUT"
