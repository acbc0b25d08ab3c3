#!/usr/bin/env bash
# Apply cost: a topic of REPLAY_RECORDS records read to its end by a bare
# consumer (logbench consume: pollbox's client settings, nothing done with the
# records) and by `pollbox serve` (one worker) until /readyz is 200, alternated.
# Each run: wall time, records/s, the process's CPU (utime + stime from
# /proc/PID/stat when done) per record, the broker's CPU over the run.
#
#   benches/log/replay.sh            # results/DATE-replay.txt
#
# Knobs: REPLAY_RECORDS (10000000), REPLAY_BYTES (512), REPLAY_KEYS (10000),
# REPLAY_PARTITIONS (4), REPLAY_REPS (3), REPLAY_TOPIC (an existing, filled
# topic to reuse), REPLAY_NEW_TOPIC (the name of the topic to create and fill),
# REPLAY_VARIANTS ("bare pollbox"; a variant ending in +client runs with the
# `[log.client]` lines REPLAY_CLIENT, the bare consumer with the same
# properties: e.g. REPLAY_CLIENT='"fetch.queue.backoff.ms" = "1000"'
# REPLAY_VARIANTS="bare pollbox pollbox+client"; a variant pollbox@N runs
# with `log.consumers = N`: REPLAY_VARIANTS="bare pollbox@1 pollbox@2
# pollbox@4", with LOG_NODE_CPU naming as many cores); lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
RECORDS=${REPLAY_RECORDS:-10000000}
BYTES=${REPLAY_BYTES:-512}
KEYS=${REPLAY_KEYS:-10000}
PARTS=${REPLAY_PARTITIONS:-4}
REPS=${REPLAY_REPS:-3}
VARIANTS=${REPLAY_VARIANTS:-bare pollbox}
ALT=${REPLAY_CLIENT:-}
OUT=$RESULTS/$(date -u +%F)-replay.txt
build
broker_up
quiet
header "$OUT" "REPLAY_RECORDS=$RECORDS REPLAY_BYTES=$BYTES REPLAY_KEYS=$KEYS REPLAY_REPS=$REPS REPLAY_VARIANTS='$VARIANTS' REPLAY_CLIENT='$ALT' benches/log/replay.sh"
[[ -z "$ALT" ]] || echo "# +client: [log.client] $ALT (the bare consumer gets the same properties)" | tee -a "$OUT"
df -h /tmp | tail -1 | sed 's/^/# disk: /' | tee -a "$OUT"

if [[ -n "${REPLAY_TOPIC:-}" ]]; then
  TOPIC=$REPLAY_TOPIC
  echo "# topic $TOPIC reused" | tee -a "$OUT"
else
  TOPIC=${REPLAY_NEW_TOPIC:-replay-$RECORDS-$$}
  topic_create "$TOPIC" "$PARTS"
  echo "# filling $TOPIC: $RECORDS records of $BYTES B on $KEYS keys, $PARTS partitions (logbench fill on CPU $NODE_CPU)" | tee -a "$OUT"
  b0=$(ticks "$BROKER_PID")
  taskset -c "$NODE_CPU" "$LOGBENCH" fill --brokers "$BOOTSTRAP" --topic "$TOPIC" \
    --records "$RECORDS" --bytes "$BYTES" --keys "$KEYS" | tee "$WORK/fill.json"
  b1=$(ticks "$BROKER_PID")
  echo "fill $(cat "$WORK/fill.json") broker_cpu_s $(((b1 - b0) / HZ))" >>"$OUT"
fi

# The bare consumer once, unmeasured: the segments into the page cache.
taskset -c "$NODE_CPU" "$LOGBENCH" consume --brokers "$BOOTSTRAP" --topic "$TOPIC" >/dev/null


port=19100
run_one() { # VARIANT REP
  local variant=$1 rep=$2 client="" t0 t1 b0 b1 cpu pid records extra=""
  [[ "$variant" == *+client ]] && client=$ALT
  case "$variant" in
    bare*)
      local cargs
      cargs=$(client_arg "$client")
      rm -f "$WORK/bare.json"
      b0=$(ticks "$BROKER_PID")
      t0=$(now)
      # shellcheck disable=SC2086
      taskset -c "$NODE_CPU" "$LOGBENCH" consume --brokers "$BOOTSTRAP" --topic "$TOPIC" --hold \
        $cargs >"$WORK/bare.json" &
      pid=$!
      STARTED_PIDS+=("$pid")
      until [[ -s "$WORK/bare.json" ]]; do sleep 0.02; done
      t1=$(now); cpu=$(ticks "$pid"); b1=$(ticks "$BROKER_PID")
      kill "$pid"; wait "$pid" 2>/dev/null || true
      records=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["records"])' "$WORK/bare.json")
      extra="self $(cat "$WORK/bare.json")"
      ;;
    pollbox*)
      port=$((port + 1))
      b0=$(ticks "$BROKER_PID")
      local consumers=${LOG_CONSUMERS:-}
      [[ "$variant" == *@* ]] && consumers=${variant#*@} && consumers=${consumers%%+*}
      LOG_CLIENT=$client LOG_CONSUMERS=$consumers node_up "replay-$rep-${variant//@/-}" "$port" "$TOPIC"
      pid=$NODE_PID t0=$NODE_T0
      until ready "$port"; do sleep 0.02; done
      t1=$(now); cpu=$(ticks "$pid"); b1=$(ticks "$BROKER_PID")
      records=$(metric "$port" pollbox_log_records_total)
      extra="process_cpu_seconds_total $(metric "$port" process_cpu_seconds_total)"
      node_down "$pid"
      ;;
  esac
  python3 - "$variant" "$rep" "$t0" "$t1" "$records" "$cpu" "$((b1 - b0))" "$HZ" "$extra" <<'PY'
import sys
v, rep, t0, t1, n, cpu, b, hz, extra = sys.argv[1:]
wall = float(t1) - float(t0); n = int(n); cpu = int(cpu) / int(hz); b = int(b) / int(hz)
print(f"run {v:14s} rep {rep}  records {n}  wall {wall:7.2f} s  {n / wall:10,.0f} records/s  "
      f"CPU {cpu:6.2f} s = {cpu * 1e6 / n:5.3f} us/record  broker CPU {b:6.2f} s = {b * 1e6 / n:5.3f} us/record  # {extra}")
PY
}

for rep in $(seq 1 "$REPS"); do
  for v in $VARIANTS; do
    # Not in a pipeline: the nodes it starts stay this shell's to clean up.
    run_one "$v" "$rep" >"$WORK/line"
    tee -a "$OUT" <"$WORK/line"
  done
done

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"run (\S+)\s+rep \d+\s+records (\d+)\s+wall\s+([\d.]+) s\s+([\d,]+) records/s\s+CPU\s+([\d.]+) s = ([\d.]+) us/record\s+broker CPU\s+([\d.]+) s = ([\d.]+)", line)
    if m:
        runs.setdefault(m[1], []).append([float(m[i].replace(",", "")) for i in (3, 4, 6, 8)])
print("# medians: variant, wall s, records/s, CPU us/record, broker CPU us/record, CPU us/record minus the bare consumer's of the same settings")
for v, rs in runs.items():
    med = [st.median(c) for c in zip(*rs)]
    base = runs.get("bare+client" if v.endswith("+client") and "bare+client" in runs else "bare")
    d = med[2] - st.median(r[2] for r in base) if base else float("nan")
    print(f"median {v:14s} wall {med[0]:7.2f} s  {med[1]:10,.0f} records/s  CPU {med[2]:.3f} us/record  broker {med[3]:.3f} us/record  minus bare {d:+.3f} us  ({len(rs)} runs)")
PY
echo "# raw: $OUT"
