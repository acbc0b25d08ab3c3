#!/usr/bin/env bash
# The write-ahead file's cost on one worker, side by side in one run: two nodes
# (`--workers 1`, snapshot every 10 s in both, one with `[wal]`), the disk's own
# sync latency beside them, alternated round by round:
#  - probe:        syncprobe, 4 KiB write + fdatasync in a loop on the same folder
#                  (the floor: what one sync costs this disk);
#  - batch-snap / batch-wal: POST /v1/ingest, 100 x 512 B a request, BATCH_CONNECTIONS
#                  connections x BATCH_PIPELINE;
#  - single1-wal:  POST /v1/boxes/{key} over one connection, one at a time (one sync
#                  a message: the baseline of many connections);
#  - single-snap / single-wal: single 512 B messages open-loop at SINGLE_RATE/s over
#                  16 connections (latency from the intended send time);
#  - many-snap / many-wal: 1,000 connections each posting single messages, closed loop.
#  - single-redis (SPEED_REDIS=1): Redis (appendfsync always, on the servers' CPU)
#                  given the same single messages by benches/wal/redis-single.py: SETs
#                  of 512 B open-loop at SINGLE_RATE/s over 16 connections, latency
#                  from the intended send time (the state of the art beside the
#                  p99 goal).
# Each line: messages/s, answer p50/p99, errors, server CPU per message (utime +
# stime of the node from /proc/PID/stat over the run, warm-up included, divided by
# pollbox_ingest_messages_total over the same span), records per sync, the node's
# own syncs' p99, the CPU per message by thread (/proc/PID/task/*/stat). Then the
# medians and the ratios of the goals (BENCHMARKS.md, "The write-ahead file").
#
#   benches/wal/speed.sh            # results/DATE-speed.txt
#
# Knobs: SPEED_REPS (3), SPEED_DURATION (8 s), SPEED_PROBE_S (5), SINGLE_RATE (1000),
# BATCH_CONNECTIONS (16), BATCH_PIPELINE (1: requests in flight a connection),
# MANY_CONNECTIONS (1000), SPEED_KINDS ("batch single many": the
# probe runs always), SPEED_REDIS (0), WAL_TAG; lib.sh's WAL_* knobs.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "$0")/lib.sh"
REPS=${SPEED_REPS:-3}
DUR=${SPEED_DURATION:-8}
PROBE_S=${SPEED_PROBE_S:-5}
RATE=${SINGLE_RATE:-1000}
MANY=${MANY_CONNECTIONS:-1000}
BCONNS=${BATCH_CONNECTIONS:-16}
BDEPTH=${BATCH_PIPELINE:-1}
REDIS=${SPEED_REDIS:-0}
KINDS=${SPEED_KINDS:-batch single many}
OUT=$RESULTS/$(date -u +%F)-speed${WAL_TAG:+-$WAL_TAG}.txt
build
header "$OUT" "SPEED_REPS=$REPS SPEED_DURATION=$DUR SPEED_PROBE_S=$PROBE_S SINGLE_RATE=$RATE MANY_CONNECTIONS=$MANY BATCH_CONNECTIONS=$BCONNS BATCH_PIPELINE=$BDEPTH SPEED_KINDS='$KINDS' SPEED_REDIS=$REDIS benches/wal/speed.sh"

node_up snap 19311 snap
declare -A PID_OF=([snap]=$NODE_PID) PORT_OF=([snap]=19311)
node_up wal 19312 wal
PID_OF[wal]=$NODE_PID PORT_OF[wal]=19312
wait_ready 19311 snap 60
wait_ready 19312 wal 60
REDIS_PID=""
if [[ $REDIS == 1 ]]; then
  mkdir -p "$WORK/redis"
  taskset -c "$SERVER_CPU" redis-server --port 19313 --bind 127.0.0.1 --dir "$WORK/redis" \
    --appendonly yes --appendfsync always --auto-aof-rewrite-percentage 0 --save '' \
    --daemonize no --logfile "$WORK/redis/redis.log" &
  REDIS_PID=$!
  STARTED_PIDS+=("$REDIS_PID")
  for _ in $(seq 100); do redis-cli -p 19313 ping >/dev/null 2>&1 && break; sleep 0.05; done
  echo "# single-redis: $(redis-server --version); appendonly yes, appendfsync always; benches/wal/redis-single.py 19313 $RATE $DUR 1 16" | tee -a "$OUT"
fi

COMMON=(--body-bytes 512 --keys 10000 --warmup 1s -d "${DUR}s" -q --max-error-rate 1)
BATCH=(--mix batch:100 --batch-size 100 -c "$BCONNS" --pipeline "$BDEPTH" "${COMMON[@]}")
SINGLE1=(--mix ingest:100 -c 1 "${COMMON[@]}")
SINGLE=(--mix ingest:100 -c 16 -R "$RATE" "${COMMON[@]}")
MANYC=(--mix ingest:100 -c "$MANY" "${COMMON[@]}")
{
  echo "# batch: pollbox load ${BATCH[*]}"
  echo "# single1: pollbox load ${SINGLE1[*]}"
  echo "# single: pollbox load ${SINGLE[*]}"
  echo "# many: pollbox load ${MANYC[*]}"
  echo "# probe: syncprobe DIR $PROBE_S 4096 (DIR beside the nodes' data, $WORK)"
} | tee -a "$OUT"

# run NAME(KIND-NODE) REP LOAD-ARGS...: one `pollbox load` run against NODE; prints its line.
run() {
  local name=$1 rep=$2; shift 2
  local node=${name##*-}
  local port=${PORT_OF[$node]} pid=${PID_OF[$node]} t0 t1 m0 m1 r0 r1 s0 s1
  local json=$WORK/$name-$rep.json
  t0=$(ticks "$pid"); m0=$(metric "$port" pollbox_ingest_messages_total)
  r0=$(metric "$port" pollbox_wal_records_total); s0=$(metric "$port" pollbox_wal_syncs_total)
  sync_hist "$port" >"$WORK/h0"
  thread_ticks "$pid" >"$WORK/t0"
  taskset -c "$LOAD_CPU" "$POLLBOX" load --url "http://127.0.0.1:$port" "$@" --json "$json" \
    >"$WORK/load.txt" 2>&1 || { echo "# load failed:"; sed 's/^/#   /' "$WORK/load.txt"; }
  t1=$(ticks "$pid"); m1=$(metric "$port" pollbox_ingest_messages_total)
  r1=$(metric "$port" pollbox_wal_records_total); s1=$(metric "$port" pollbox_wal_syncs_total)
  sync_hist "$port" >"$WORK/h1"
  thread_ticks "$pid" >"$WORK/t1"
  python3 - "$json" "$name" "$rep" "$((t1 - t0))" "$HZ" "$m0" "$m1" "$r0" "$r1" "$s0" "$s1" "$WORK/h0" "$WORK/h1" "$WORK/t0" "$WORK/t1" <<'PY'
import json, sys
path, name, rep, t, hz, m0, m1, r0, r1, s0, s1, h0, h1, tt0, tt1 = sys.argv[1:]
def hist(f):
    return [(float(le), float(c)) for le, c in (l.split() for l in open(f))]
# The node's own syncs over the run (pollbox_wal_sync_seconds): p99 as its bucket's upper bound.
d = [(le, c1 - c0) for (le, c0), (_, c1) in zip(hist(h0), hist(h1))]
sp99 = "-"
if d and d[-1][1] > 0:
    sp99 = next(f"<= {le * 1e3:g} ms" for le, c in d if c >= 0.99 * d[-1][1])
r = json.load(open(path)); l = r["latency_ms"]
msgs = float(m1) - float(m0)
cpu = int(t) / int(hz) * 1e6 / max(msgs, 1)
syncs = float(s1) - float(s0)
rps = f"{(float(r1) - float(r0)) / syncs:.1f}" if syncs > 0 else "-"
# By thread (the kernel's names): µs a message.
def threads(f):
    d = {}
    for l in open(f):
        n, v = l.split()
        n = n if n.startswith("pollbox") else "other"
        d[n] = d.get(n, 0) + int(v)
    return d
a, b = threads(tt0), threads(tt1)
by = " ".join(f"{n}={(b[n] - a.get(n, 0)) / int(hz) * 1e6 / max(msgs, 1):.2f}" for n in sorted(b) if b[n] - a.get(n, 0) > 0)
print(f"{name:12s} rep {rep}  {r['messages_per_s']:10,.0f} msg/s  p50 {l['p50']:.3f}  p99 {l['p99']:.3f} ms  "
      f"errors {r['errors_total']}  server CPU {cpu:.2f} us/msg ({int(t) / int(hz):.2f} s over {msgs:,.0f} msgs)  records/sync {rps}  sync p99 {sp99}  by thread us/msg: {by or '-'}")
PY
}

# sync_hist PORT: "le count" of each bucket of pollbox_wal_sync_seconds (none without [wal]).
sync_hist() {
  curl -sf "http://127.0.0.1:$1/metrics" | sed -n 's/^pollbox_wal_sync_seconds_bucket{le="\([^"]*\)"} \(.*\)/\1 \2/p' | sed 's/^+Inf/inf/'
}

# run_redis REP: Redis given the single messages; prints a line as `run` does.
run_redis() {
  local t0 t1 c0 c1
  c0=$(redis-cli -p 19313 info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p')
  t0=$(ticks "$REDIS_PID")
  taskset -c "$LOAD_CPU" python3 "$ROOT/benches/wal/redis-single.py" 19313 "$RATE" "$DUR" 1 16 "$WORK/redis.json"
  t1=$(ticks "$REDIS_PID")
  c1=$(redis-cli -p 19313 info stats | tr -d '\r' | sed -n 's/^total_commands_processed://p')
  python3 - "$WORK/redis.json" "$1" "$((t1 - t0))" "$HZ" "$((c1 - c0 - 1))" <<'PY'
import json, sys
path, rep, t, hz, msgs = sys.argv[1:]
r = json.load(open(path)); l = r["latency_ms"]
cpu = int(t) / int(hz) * 1e6 / max(int(msgs), 1)
print(f"single-redis rep {rep}  {r['messages_per_s']:10,.0f} msg/s  p50 {l['p50']:.3f}  p99 {l['p99']:.3f} ms  "
      f"errors {r['errors_total']}  server CPU {cpu:.2f} us/msg ({int(t) / int(hz):.2f} s over {int(msgs):,} commands)")
PY
}

probe() { # REP
  mkdir -p "$WORK/probe"
  echo "probe        rep $1  $(taskset -c "$SERVER_CPU" "$SYNCPROBE" "$WORK/probe" "$PROBE_S" 4096)"
}

has() { [[ " $KINDS " == *" $1 "* ]]; }
for rep in $(seq 1 "$REPS"); do
  {
    probe "$rep"
    if has batch; then
      run batch-snap "$rep" "${BATCH[@]}"
      run batch-wal "$rep" "${BATCH[@]}"
    fi
    if has single; then
      run single1-wal "$rep" "${SINGLE1[@]}"
      run single-snap "$rep" "${SINGLE[@]}"
      run single-wal "$rep" "${SINGLE[@]}"
      [[ -z "$REDIS_PID" ]] || run_redis "$rep"
    fi
    if has many; then
      run many-snap "$rep" "${MANYC[@]}"
      run many-wal "$rep" "${MANYC[@]}"
    fi
    contention
  } | tee -a "$OUT"
done
for n in snap wal; do
  echo "# $n node's log: $(tr '\n' ' ' <"$WORK/$n.log" | cut -c1-400)" | tee -a "$OUT"
done

python3 - "$OUT" <<'PY' | tee -a "$OUT"
import re, sys, statistics as st
rows, probes = {}, []
for line in open(sys.argv[1]):
    m = re.match(r"(\S+)\s+rep \d+\s+([\d,]+) msg/s\s+p50 (\S+)\s+p99 (\S+) ms.*server CPU ([\d.]+) us/msg", line)
    if m:
        rows.setdefault(m[1], []).append([float(m[2].replace(",", ""))] + [float(m[i]) for i in range(3, 6)])
    m = re.match(r"probe\s+rep \d+\s+syncs (\d+) mean_ms (\S+) p50_ms (\S+) p90_ms (\S+) p99_ms (\S+)", line)
    if m:
        probes.append([float(m[i]) for i in (2, 3, 5)])
med = {k: [st.median(c) for c in zip(*v)] for k, v in rows.items()}
print("# medians: msg/s, answer p50 / p99 ms, server CPU us/msg (= msg/s per core of server CPU)")
for k, m in med.items():
    print(f"median {k:12s} {m[0]:10,.0f} msg/s  {m[1]:.3f} / {m[2]:.3f} ms  {m[3]:.2f} us/msg = {1e6 / m[3]:,.0f} msg/s per core  ({len(rows[k])} runs)")
pm = [st.median(c) for c in zip(*probes)]
print(f"median probe        fdatasync of 4 KiB: mean {pm[0]:.3f} ms (1/mean = {1e3 / pm[0]:,.0f} syncs/s), p50 {pm[1]:.3f}, p99 {pm[2]:.3f} ms  ({len(probes)} runs)")
g = lambda k, i: med[k][i]
def ratios(k1, k2, i):
    return ", ".join(f"{a[i] / b[i]:.2f}" for a, b in zip(rows[k1], rows[k2]))
has = lambda *ks: all(k in med for k in ks)
if has("batch-wal", "batch-snap"):
  print(f"# batch: wal / snap msg/s {g('batch-wal', 0) / g('batch-snap', 0):.2f} (by round {ratios('batch-wal', 'batch-snap', 0)}; goal >= 0.8)")
if has("single-wal", "single-snap", "single1-wal"):
  print(f"# single at the rate: wal p99 {g('single-wal', 2):.3f} ms vs the disk's sync p99 {pm[2]:.3f} ms + 1 ms = {pm[2] + 1:.3f} "
      f"(goal <= it: {'met' if g('single-wal', 2) <= pm[2] + 1 else 'NOT met'}); snap p99 {g('single-snap', 2):.3f} ms; "
      f"one connection one at a time: wal p99 {g('single1-wal', 2):.3f} ms")
if has("single-redis"):
  print(f"# single at the rate, Redis (appendfsync always): p99 {g('single-redis', 2):.3f} ms vs the disk's sync p99 + 1 ms = {pm[2] + 1:.3f} "
      f"({'within' if g('single-redis', 2) <= pm[2] + 1 else 'NOT within'}); pollbox's wal p99 / Redis's {g('single-wal', 2) / g('single-redis', 2):.2f}x")
if has("many-wal", "many-snap", "single1-wal"):
  print(f"# many connections: wal {g('many-wal', 0):,.0f} msg/s = {g('many-wal', 0) * pm[0] / 1e3:.1f}x 1/(mean sync) "
      f"and {g('many-wal', 0) / g('single1-wal', 0):.1f}x one connection one at a time ({g('single1-wal', 0):,.0f} msg/s) (goal >= 20x); "
      f"snap {g('many-snap', 0):,.0f} msg/s (wal / snap {g('many-wal', 0) / g('many-snap', 0):.2f})")
for k in ("batch", "single", "many"):
  if has(f"{k}-wal", f"{k}-snap"):
    print(f"# server CPU per message wal / snap, {k}: {g(f'{k}-wal', 3) / g(f'{k}-snap', 3):.2f}")
PY
echo "# raw: $OUT"
