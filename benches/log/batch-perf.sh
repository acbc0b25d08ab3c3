#!/usr/bin/env bash
# Where a node's CPU goes while it takes batch ingest through the log: one
# node (one worker) on LOG_NODE_CPU under `pollbox load --mix batch:100`, the
# broker and the generator on LOG_LOAD_CPU. Reports messages/s, the node's
# and the broker's CPU per message, the node's CPU and context switches by
# thread per message, and a `perf record` (cpu-clock: this VM has no hardware
# counters) of the node: top symbols, and samples grouped by what they do.
#
#   benches/log/batch-perf.sh        # results/DATE-batch-perf.txt
#
# Knobs: PERF_DURATION (8 s), PERF_BATCH (100), PERF_CONNECTIONS (16);
# lib.sh's LOG_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
DUR=${PERF_DURATION:-8}
BATCH=${PERF_BATCH:-100}
CONNS=${PERF_CONNECTIONS:-16}
OUT=$RESULTS/$(date -u +%F)-batch-perf.txt
build
broker_up
quiet
header "$OUT" "PERF_DURATION=$DUR PERF_BATCH=$BATCH PERF_CONNECTIONS=$CONNS benches/log/batch-perf.sh"
LOAD_ARGS=(--mix batch:100 --batch-size "$BATCH" --body-bytes 512 --keys 10000 -c "$CONNS" --pipeline 1)
echo "# pollbox load ${LOAD_ARGS[*]} -d ${DUR}s" | tee -a "$OUT"

TOPIC=batchperf-$$
topic_create "$TOPIC" 4
node_up log 19203 "$TOPIC"
wait_ready 19203 60
# A fresh broker's JIT, and the node's first records: left out.
"$POLLBOX" load --url http://127.0.0.1:19203 "${LOAD_ARGS[@]}" -d 4s -q >/dev/null 2>&1 || true

# Per thread: name, utime+stime ticks, voluntary + involuntary switches.
threads() {
  local t
  for t in /proc/"$NODE_PID"/task/*; do
    printf '%s\t%s\t%s\n' "$(cat "$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")" \
      "$(awk '/ctxt_switches/ {s += $2} END {print s}' "$t/status")"
  done | sort
}
threads >"$WORK/threads0"
t0=$(ticks "$NODE_PID"); b0=$(ticks "$BROKER_PID")
perf record -q -F 999 -g -p "$NODE_PID" -o "$WORK/node.data" -- sleep "$DUR" 2>/dev/null &
rec=$!
"$POLLBOX" load --url http://127.0.0.1:19203 "${LOAD_ARGS[@]}" -d "${DUR}s" --json "$WORK/load.json" -q >"$WORK/load.txt" 2>&1 \
  || { echo "load failed:"; cat "$WORK/load.txt"; }
wait "$rec" || true
t1=$(ticks "$NODE_PID"); b1=$(ticks "$BROKER_PID")
threads >"$WORK/threads1"

python3 - "$WORK/load.json" "$((t1 - t0))" "$((b1 - b0))" "$HZ" "$DUR" "$WORK/threads0" "$WORK/threads1" <<'PY' | tee -a "$OUT"
import json, sys, collections
path, t, b, hz, dur, th0, th1 = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]
msgs = r["messages_per_s"] * float(dur)
us = lambda ticks: int(ticks) / int(hz) * 1e6 / max(msgs, 1)
print(f"{r['messages_per_s']:,.0f} msg/s  answer p50 {l['p50']:.3f}  p99 {l['p99']:.3f} ms  errors {r['errors_total']}  "
      f"node CPU {us(t):.2f} us/msg  broker CPU {us(b):.2f} us/msg")
def read(p):
    d = collections.defaultdict(lambda: [0, 0])
    for line in open(p):
        name, ticks, sw = line.rstrip("\n").split("\t")
        d[name][0] += int(ticks); d[name][1] += int(sw)
    return d
a, z = read(th0), read(th1)
print("# by thread: CPU us/msg, context switches per message")
for name in sorted(z, key=lambda n: -(z[n][0] - a.get(n, [0, 0])[0])):
    dt = z[name][0] - a.get(name, [0, 0])[0]; ds = z[name][1] - a.get(name, [0, 0])[1]
    if dt or ds:
        print(f"  {name:18s} {us(dt):6.2f} us/msg  {ds / max(msgs, 1):6.3f} switches/msg")
PY

# PERF_KEEP=FILE keeps the samples (and the binary beside them, FILE.bin) for perf annotate.
if [ -n "${PERF_KEEP:-}" ]; then cp "$WORK/node.data" "$PERF_KEEP"; cp "$POLLBOX" "$PERF_KEEP.bin"; fi
perf report -i "$WORK/node.data" --no-children --sort comm,dso -g none -q 2>/dev/null | sed -n 1,14p >"$WORK/dso"
perf report -i "$WORK/node.data" --no-children --sort sym -g none -q 2>/dev/null >"$WORK/syms"
perf report -i "$WORK/node.data" --no-children --sort comm,sym -g none -q 2>/dev/null >"$WORK/comm-syms"
CPU_PER_MSG=$(sed -n 's/.*node CPU \([0-9.]*\) us\/msg.*/\1/p' "$OUT" | tail -1)
{
  echo "## samples by thread and object"
  cat "$WORK/dso"
  echo "## top symbols"
  sed -n 1,40p "$WORK/syms"
  echo "## by thread and job: us per message (share of the samples x node CPU per message; symbol patterns in batch-perf.sh)"
  python3 - "$CPU_PER_MSG" "$WORK/comm-syms" <<'PY'
import re, sys, collections
cpu, path = float(sys.argv[1]), sys.argv[2]
groups = [("HTTP and the batch's projection", r"projection|conn::|framer|http::|service::ingest|Projector"),
          ("produce calls (produce_batch, producev, headers, msg_new)", r"produce_batch|producev|rd_kafka_msg_new|rd_kafka_msg_|header|BaseProducer|OwnedHeaders|Producer::send|produce"),
          ("tickets, acks, waiters, reports", r"logged|Pending|LogReport|wakeups|crossbeam_channel|on_log_report|settle|on_wake|Ticket|Waiters|acks|PassReports|serve_acks"),
          ("apply (replica, box table)", r"Replica|replica|boxes|crossbeam_epoch|seqlock|Record|apply"),
          ("librdkafka other (fetch, requests, queues)", r"\brd_|rdkafka|lz4|crc32|snappy|zstd"),
          ("malloc and free", r"malloc|calloc|free|unlink_chunk|realloc|_int_"),
          ("locks (mutex, cond)", r"pthread_mutex|pthread_cond|__lll|futex"),
          ("copies (memcpy, memmove)", r"memcpy|memmove|memset"),
          ("clock reads", r"clock_gettime"),
          ("kernel: scheduling (switches, wake-ups)", r"\[k\] (finish_task_switch|schedule|__schedule|try_to_wake_up|_raw_spin_unlock_irq|ttwu|enqueue|dequeue|pick_next|update_curr)"),
          ("kernel: poll, epoll, eventfd, pipes", r"\[k\] .*(poll|epoll|eventfd|pipe|fdget|fput|wake)"),
          ("kernel: sockets and copies", r"\[k\] .*(tcp|sock|skb|copy|iter|inet|ip_|__check_object)"),
          ("kernel: other", r"\[k\]")]
tab = collections.defaultdict(lambda: collections.defaultdict(float))
for line in open(path):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(.*)", line)
    if not m: continue
    pct, comm, sym = float(m[1]), m[2], m[3]
    for g, pat in groups:
        if re.search(pat, sym): tab[comm][g] += pct; break
    else: tab[comm]["other"] += pct
comms = sorted(tab, key=lambda c: -sum(tab[c].values()))
comms = [c for c in comms if sum(tab[c].values()) >= 0.5]
print(f"| job | " + " | ".join(comms) + " | all |")
print("|---|" + "---:|" * (len(comms) + 1))
for g in [g for g, _ in groups] + ["other"]:
    row = [tab[c][g] * cpu / 100 for c in comms]
    print(f"| {g} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {sum(row):.2f} |")
row = [sum(tab[c].values()) * cpu / 100 for c in comms]
print("| all | " + " | ".join(f"{v:.2f}" for v in row) + f" | {sum(row):.2f} |")
PY
} | tee -a "$OUT"
echo "# raw: $OUT"
