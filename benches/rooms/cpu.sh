#!/usr/bin/env bash
# Server CPU per delivered event: one room's updates delivered as one-box streams
# against prefix streams (docs/http.md#rooms), alternated in one run:
#
#   bash benches/rooms/cpu.sh        # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# The update stream: ROOMS_RATE (20,000) messages a second, batch ingest
# (ROOMS_BATCH = 10 a request, open loop, 4 connections), uniform over the
# ROOMS_BOXES (100) boxes of room-0/ (`pollbox load --rooms 1 --keys 100`: keys
# room-0/lg-0 .. room-0/lg-99, pre-seeded). S = ROOMS_SUBS (2) subscribers each
# want the whole room:
#  - onebox: each holds one event stream per box, GET /v1/boxes/room-0/lg-K
#    (`--sse S*100`: stream i on box i % 100), S*100 streams;
#  - prefix: each holds one prefix stream of room-0/ (`--prefix-streams S`);
#  - none: no subscriber, the publishing's own CPU.
# A fresh server (one worker, CPU 0, benches/rooms/rooms.toml) per run; the
# generator on CPU 1. Once the streams are open and 2 s more have passed,
# ROOMS_SECONDS (10) s are measured: server utime + stime from /proc/PID/stat,
# events delivered from pollbox_sse_events_total. Per event: gross (all the
# server's CPU) and net (less the none run's CPU of the same round). Rounds of
# none, onebox, prefix: ROOMS_REPS (3). Writes benches/rooms/results/<date>-cpu.txt.
source "$(dirname "$0")/lib.sh"
S=${ROOMS_SUBS:-2}
RATE=${ROOMS_RATE:-20000}
BATCH=${ROOMS_BATCH:-10}
BOXES=${ROOMS_BOXES:-100}
SECS=${ROOMS_SECONDS:-10}
REPS=${ROOMS_REPS:-3}
OUT=$RES/$(date -u +%F)-cpu${ROOMS_TAG:-}.txt

run_one() { # kind rep
    local kind=$1 rep=$2 streams=() gauge="" want=0
    case $kind in
        onebox) streams=(--sse $((S * BOXES))); gauge=pollbox_sse_subscribers; want=$((S * BOXES)) ;;
        prefix) streams=(--prefix-streams "$S"); gauge=pollbox_prefix_streams; want=$S ;;
    esac
    start_server
    L --rooms 1 --keys "$BOXES" --preseed --mix batch --batch-size "$BATCH" \
        --rate "$((RATE / BATCH))" -c 4 --warmup 3s --duration "$((SECS + 4))s" \
        "${streams[@]}" -q --json "$D/$kind-$rep.json" >"$D/$kind-$rep.txt" 2>&1 &
    local lp=$!
    if [ -n "$gauge" ]; then wait_metric "$gauge" "$want" 60; fi
    sleep 2
    local c0 e0 t0 c1 e1 t1 subs
    c0=$(cpu_ticks); e0=$(metric pollbox_sse_events_total); t0=$(date +%s.%N)
    sleep "$SECS"
    c1=$(cpu_ticks); e1=$(metric pollbox_sse_events_total); t1=$(date +%s.%N)
    subs=$(metric pollbox_sse_subscribers)
    wait $lp || { echo "pollbox load failed ($kind $rep):" >&2; cat "$D/$kind-$rep.txt" >&2; }
    stop_server
    python3 - "$kind" "$rep" "$c0" "$c1" "$e0" "$e1" "$t0" "$t1" "$TICK" "$subs" "$D/$kind-$rep.json" <<'PY'
import json, sys
kind, rep = sys.argv[1], int(sys.argv[2])
c0, c1, e0, e1, t0, t1, tick = (float(x) for x in sys.argv[3:10])
r = json.load(open(sys.argv[11]))
gen = r.get("sse") or r.get("prefix_streams") or {}
print(json.dumps({
    "kind": kind, "rep": rep, "seconds": round(t1 - t0, 3),
    "server_cpu_s": round((c1 - c0) / tick, 3),
    "events": int(e1 - e0), "events_per_s": round((e1 - e0) / (t1 - t0), 1),
    "subscribers": int(float(sys.argv[10])),
    "messages_per_s": round(r["messages_per_s"], 1), "errors": r["errors_total"],
    "generator_events_per_s": round(gen.get("events_per_s", 0.0), 1),
    "generator_stream_errors": gen.get("errors", 0),
}))
PY
}

log_to "$OUT"
header "bash benches/rooms/cpu.sh: ROOMS_SUBS=$S ROOMS_RATE=$RATE ROOMS_BATCH=$BATCH ROOMS_BOXES=$BOXES ROOMS_SECONDS=$SECS ROOMS_REPS=$REPS"
echo "# per round, a fresh server each: none (publisher only), onebox ($((S * BOXES)) streams of one box), prefix ($S streams of room-0/)"
rounds none onebox prefix
machine_state
python3 - "$D/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
by = {}
for r in runs:
    by.setdefault(r["rep"], {})[r["kind"]] = r
print()
print(f"{'round':>5} {'kind':>7} {'cpu %':>7} {'events/s':>10} {'gross us/event':>15} {'net us/event':>13}")
ratios_gross, ratios_net, per = [], [], {"onebox": [], "prefix": []}
for rep in sorted(by):
    k = by[rep]
    none_cpu = k["none"]["server_cpu_s"] / k["none"]["seconds"]
    vals = {}
    for kind in ("none", "onebox", "prefix"):
        r = k[kind]
        cpu = r["server_cpu_s"] / r["seconds"]
        ev = r["events_per_s"]
        gross = 1e6 * cpu / ev if ev else float("nan")
        net = 1e6 * (cpu - none_cpu) / ev if ev else float("nan")
        vals[kind] = (gross, net)
        if kind != "none":
            per[kind].append((gross, net))
        print(f"{rep:>5} {kind:>7} {100 * cpu:>7.1f} {ev:>10.0f} {gross:>15.3f} {net:>13.3f}")
    ratios_gross.append(vals["prefix"][0] / vals["onebox"][0])
    ratios_net.append(vals["prefix"][1] / vals["onebox"][1])
    print(f"{rep:>5} ratio prefix / onebox: gross {ratios_gross[-1]:.3f}, net {ratios_net[-1]:.3f}")
med = statistics.median
print()
for kind in ("onebox", "prefix"):
    print(f"median {kind}: gross {med(g for g, _ in per[kind]):.3f} us/event, net {med(n for _, n in per[kind]):.3f} us/event")
print(f"median of the rounds' ratios prefix / onebox: gross {med(ratios_gross):.3f}, net {med(ratios_net):.3f} (goal <= 1.2)")
PY
