#!/usr/bin/env bash
# Instructions per ingested message to keys under no watched prefix, with 10,000
# prefix streams open on other prefixes against none (callgrind, as
# benches/ingest/callgrind.sh counts a message):
#
#   bash benches/rooms/callgrind.sh  # BENCH_NO_BUILD=1 / POLLBOX_BIN=path: see lib.sh
#
# The server runs under callgrind (one worker, CPU 0, benches/rooms/rooms.toml).
#  - none: nothing open;
#  - streams-N: `pollbox load --prefix-streams N --prefix 'watch-{i}/'` holds N
#    prefix streams on N prefixes nothing is ingested under (each lists an empty
#    room and syncs), until pollbox_prefix_streams says N; N in ROOMS_STREAMS
#    ("10000 1": the brief's 10,000, and one stream, what any open stream costs).
# Then the counts are zeroed (`callgrind_control -z`: opening the streams is not
# counted, nor is closing them: the counts are dumped, `-d`, as the ingest ends),
# and `pollbox load` sends batch ingest as benches/ingest/callgrind.sh
# does (ROOMS_BATCH = 100 messages of ROOMS_BODY = 512 B a request, 2 connections
# x pipeline 2, ROOMS_DURATION = 8 s) to ROOMS_KEYS (1,000) keys in ROOMS_ROOMS
# (100) rooms: room-<n % 100>/lg-<n>, whose prefixes ("" and room-<r>/) are all
# unwatched. Per message (the messages the generator saw accepted): the worker's
# `Worker::read` inclusive (reading, framing, projection, apply, the wake-ups,
# answers), `Waiters::notify_prefixes` (the prefix wake-ups, called once a prefix
# stream is open anywhere: a hash and a filter load per prefix of the key, a mutex
# and a map look-up where the filter's bucket counts a watched prefix),
# `BoxTable::apply`, `Projector::project`, and the whole program (every thread,
# the idle loop and timers too), with where notify_prefixes' instructions go.
# ROOMS_REPS (2) rounds of none, streams-N.... Writes
# benches/rooms/results/<date>-callgrind.txt; ROOMS_KEEP=1 keeps callgrind's files.
source "$(dirname "$0")/lib.sh"
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
COUNTS=${ROOMS_STREAMS:-10000 1}   # the streams rounds: one per count
DUR=${ROOMS_DURATION:-8}
BATCH=${ROOMS_BATCH:-100}
BODY=${ROOMS_BODY:-512}
KEYS=${ROOMS_KEYS:-1000}
NROOMS=${ROOMS_ROOMS:-100}
REPS=${ROOMS_REPS:-2}
OUT=$RES/$(date -u +%F)-callgrind${ROOMS_TAG:-}.txt

run_one() { # kind (none, or streams-N: N prefix streams) rep
    local kind=$1 rep=$2 hp="" cg=$D/$1-$2.cg n=${1#streams-}
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$cg" "$B" serve --config "$CFG" \
        --listen "127.0.0.1:$PORT" --workers 1 >"$D/$kind-$rep.server.log" 2>&1 &
    SRV=$!
    for _ in $(seq 300); do curl -sf "$(URL)/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
    if [ "$kind" != none ]; then
        Lbg "$D/holder-$kind-$rep.txt" --keys 1 --mix poll --rate 1 -c 1 --duration 3600s \
            --prefix-streams "$n" --prefix 'watch-{i}/' -q
        hp=$BG
        wait_metric pollbox_prefix_streams "$n" 900
    fi
    local streams
    streams=$(metric pollbox_prefix_streams)
    # Nothing but the ingest from here on (no scrape: its render is counted in
    # Worker::read); the messages are those the generator saw accepted.
    callgrind_control -z "$SRV" >/dev/null 2>&1
    sleep 1
    L --rooms "$NROOMS" --keys "$KEYS" --mix batch:100 --batch-size "$BATCH" --body-bytes "$BODY" \
        -c 2 --pipeline 2 -d "${DUR}s" --json "$D/$kind-$rep.load.json" >"$D/$kind-$rep.load.txt" 2>&1
    # Dump now: closing the streams afterwards is not counted either.
    callgrind_control -d "$SRV" >/dev/null 2>&1
    if [ -n "$hp" ]; then kill -TERM "$hp" 2>/dev/null || true; wait "$hp" 2>/dev/null || true; fi
    stop_server
    local dump
    dump=$(ls "$cg".* 2>/dev/null | grep -E '\.[0-9]+$' | head -1)
    callgrind_annotate --inclusive=yes "$dump" >"$cg.txt" 2>/dev/null
    callgrind_annotate --inclusive=yes --tree=both --threshold=100 "$dump" >"$cg.tree.txt" 2>/dev/null
    python3 - "$cg.txt" "$kind" "$rep" "$D/$kind-$rep.load.json" "$streams" <<'PY'
import json, re, sys
path, kind, rep = sys.argv[1], sys.argv[2], int(sys.argv[3])
msgs = json.load(open(sys.argv[4]))["ops"][0]["messages_accepted"]
# As benches/ingest/callgrind.sh: a function's inclusive cost appears on several
# lines, one per source file its inlined code came from; the largest is the call.
want = {"read": r"worker::(settle::<impl pollbox_server::worker::)?Worker>?::read( |$)",
        "notify_prefixes": r"Waiters::notify_prefixes( |$)",
        "apply": r"BoxTable::apply(_stamped)?( |$)", "project": r"Projector::project( |$)"}
got = {k: 0 for k in want}
got["program"] = 0
for line in open(path):
    m = re.match(r"\s*([\d,]+) ", line)
    if not m:
        continue
    if "PROGRAM TOTALS" in line:
        got["program"] = int(m.group(1).replace(",", ""))
    for k, pat in want.items():
        if re.search(pat, line):
            got[k] = max(got[k], int(m.group(1).replace(",", "")))
print(json.dumps({"kind": kind, "rep": rep, "messages": msgs, "prefix_streams": int(float(sys.argv[5] or 0)),
                  **{f"{k}_per_msg": round(v / max(msgs, 1), 1) for k, v in got.items()}}))
if got["notify_prefixes"]:
    # Where the wake-up check's instructions go: the calls it makes (the tree's
    # block of notify_prefixes) and the code inlined into it, by source file.
    print(f"#   {kind} round {rep}: Waiters::notify_prefixes per message, {got['notify_prefixes'] / msgs:,.0f} in all:")
    block, blocks = [], []
    for line in open(path.replace(".cg.txt", ".cg.tree.txt")):
        if line.strip():
            block.append(line.rstrip())
        elif block:
            blocks.append(block)
            block = []
    for b in blocks:
        if any(re.search(r"\*\s+\S*wakeups.rs:pollbox_server::wakeups::Waiters::notify_prefixes \[", l) for l in b):
            for l in b:
                m = re.match(r"\s*([\d,]+) \([^)]*\)\s+>\s+\S*:(\S+) \((\S+)x\)", l)
                if m:
                    print(f"#     calls {m.group(2)} ({m.group(3)} calls): {int(m.group(1).replace(',', '')) / msgs:,.0f}")
    shown = 0
    for line in open(path.replace(".cg.txt", ".cg.tree.txt")):
        m = re.match(r"\s*([\d,]+) \([^)]*\)\s+\*\s+(\S+):pollbox_server::wakeups::Waiters::notify_prefixes", line)
        if m and not m.group(2).endswith("wakeups.rs") and shown < 6:
            shown += 1
            print(f"#     inlined from {m.group(2).split('/src/')[-1]}: {int(m.group(1).replace(',', '')) / msgs:,.0f}")
PY
}

log_to "$OUT"
header "bash benches/rooms/callgrind.sh: ROOMS_STREAMS=\"$COUNTS\" ROOMS_DURATION=$DUR ROOMS_BATCH=$BATCH ROOMS_BODY=$BODY ROOMS_KEYS=$KEYS ROOMS_ROOMS=$NROOMS ROOMS_REPS=$REPS"
echo "# the server under valgrind --tool=callgrind; per round: none, then streams-N (N prefix streams on watch-<i>/) for N in $COUNTS"
rounds none $(for n in $COUNTS; do echo "streams-$n"; done)
machine_state
python3 - "$D/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = statistics.median
print()
cols = ("read", "notify_prefixes", "apply", "project", "program")
print(f"{'kind':>13} {'messages':>9} " + " ".join(f"{c + '/msg':>20}" for c in cols))
m = {}
kinds = list(dict.fromkeys(r["kind"] for r in runs))
for kind in kinds:
    rs = [r for r in runs if r["kind"] == kind]
    m[kind] = {c: med(r[f"{c}_per_msg"] for r in rs) for c in cols}
    print(f"{kind:>13} {sum(r['messages'] for r in rs):>9} " + " ".join(f"{m[kind][c]:>20,.0f}" for c in cols))
for kind in kinds[1:]:
    ratio = m[kind]["read"] / m["none"]["read"]
    whole = m[kind]["program"] / m["none"]["program"]
    goal = f"; goal <= +3 %: {'met' if ratio <= 1.03 else 'NOT met'}" if kind == "streams-10000" else ""
    print(f"{kind}: Worker::read per message / none's {ratio:.4f} ({100 * (ratio - 1):+.2f} %{goal}); the whole program's {whole:.4f} ({100 * (whole - 1):+.2f} %)")
PY
