#!/usr/bin/env bash
# What incremental snapshots cost, per table size: N boxes, 1 % of them
# updated per snapshot interval (1 s), for SNAP_INTERVALS intervals, so that
# compactions (a new base once the deltas pass 50 % of it) are in the average.
# For each N it prints:
#   rss/box        process RSS with N boxes minus an empty server's, per box
#   full B, full s the base: bytes and write time (pollbox_snapshot_* metrics)
#   delta B, s     a delta's bytes and write time (mean over the run)
#   B/interval     bytes written per interval, compactions included, and its
#                  share of a full snapshot
#   load chain     the load at a restart (after kill -9) from the base and its
#                  deltas (`pollbox check-config`, which loads the snapshot as a
#                  start does): wall seconds, median of SNAP_LOADS (min-max)
#   load full      the same table from one full snapshot (the base a graceful
#                  stop wrote, unsealed: versions re-stamped as after a crash)
#   and, on a line of its own, the CPU time of each load (user+sys): steadier
#   than the wall clock on a machine that other work shares
#
#   benches/snapshot/incremental.sh              # 100000 1000000
#   SNAP_SIZES="100000 1000000 10000000" benches/snapshot/incremental.sh
#
# Knobs: SNAP_SIZES, SNAP_INTERVALS (120), SNAP_LOADS (3), SNAP_BIN (default:
# build release), SNAP_WORK (data folder; default a new one under /tmp).
# The server runs on core 0, the load generator on core 1 (taskset).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZES=${SNAP_SIZES:-100000 1000000}
INTERVALS=${SNAP_INTERVALS:-120}
LOADS=${SNAP_LOADS:-3}
WORK=${SNAP_WORK:-$(mktemp -d /tmp/pollbox-incr.XXXXXX)}
mkdir -p "$WORK"
if [[ -z ${SNAP_BIN:-} ]]; then
    cargo build --release -q -p pollbox
    SNAP_BIN=target/release/pollbox
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" '$1 == m {print $2}'; }
wait_up() {
    for _ in $(seq 6000); do
        curl -s -o /dev/null "http://127.0.0.1:$1/healthz" && return 0
        sleep 0.01
    done
    echo "server on $1 did not come up" >&2
    return 1
}

PORT=0 PID=0 UP_S=0 CPU_S=0
start() { # $1 = config; sets PORT, PID, UP_S (seconds from spawn to /healthz) and CPU_S (CPU seconds the process used by then)
    PORT=$(free_port)
    local t0
    t0=$(date +%s.%N)
    taskset -c 0 "$SNAP_BIN" serve --config "$1" --listen "127.0.0.1:$PORT" --workers 1 \
        >/dev/null 2>>"$WORK/server.log" &
    PID=$!
    wait_up "$PORT"
    UP_S=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$t0" "$(date +%s.%N)")
    CPU_S=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$PID/stat")
}

echo "# benches/snapshot/incremental.sh: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
echo "# $INTERVALS intervals of 1 s, 1 % of the boxes updated per interval; server on core 0, load on core 1; raw: $WORK"
echo "# $(uptime)"
printf "%9s %8s %11s %7s %9s %7s %11s %6s %16s %16s %6s\n" boxes rss/box "full B" "full s" "delta B" "delta s" "B/interval" share "load chain s" "load full s" ratio
for n in $SIZES; do
    dir=$WORK/$n
    rm -rf "$dir"
    mkdir -p "$dir"
    cfg=$dir/pollbox.toml
    # First the full snapshot: N boxes preseeded, then a graceful stop writes
    # them as one base (sealed, so the run below extends it).
    printf '[boxes]\nmax_boxes = %d\n[snapshot]\npath = "%s"\ninterval_s = 3600\n' "$((n + n / 10))" "$dir/boxes.snap" >"$dir/seed.toml"
    start "$dir/seed.toml"
    rss0=$(metric "$PORT" process_resident_memory_bytes)
    taskset -c 1 "$SNAP_BIN" load --url "http://127.0.0.1:$PORT" --preseed --keys "$n" \
        --mix poll:100 --duration 1s --quiet >/dev/null
    sleep 2
    rss=$(metric "$PORT" process_resident_memory_bytes)
    kill -INT "$PID"; wait "$PID" || true
    full_bytes=$(stat -c %s "$dir/boxes.snap")
    printf '[boxes]\nmax_boxes = %d\n[snapshot]\npath = "%s"\ninterval_s = 1\n' "$((n + n / 10))" "$dir/boxes.snap" >"$cfg"
    start "$cfg"
    # Sample the counters every 0.1 s: each write's bytes, time and kind.
    python3 - "$PORT" "$((INTERVALS + 5))" >"$dir/writes.txt" <<'PY' &
import sys, time, urllib.request
port, secs = sys.argv[1], float(sys.argv[2])
def m():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    want = {"pollbox_snapshots_total": 0, "pollbox_snapshot_written_bytes_total": 0,
            "pollbox_snapshot_bases_total": 0, "pollbox_snapshot_write_seconds_total": 0}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            want[parts[0]] = float(parts[1])
    return want
last = m()
end = time.time() + secs
while time.time() < end:
    time.sleep(0.1)
    now = m()
    if now["pollbox_snapshots_total"] != last["pollbox_snapshots_total"]:
        d = {k: now[k] - last[k] for k in now}
        kind = "base" if d["pollbox_snapshot_bases_total"] > 0 else "delta"
        print(kind, int(d["pollbox_snapshots_total"]), int(d["pollbox_snapshot_written_bytes_total"]),
              f'{d["pollbox_snapshot_write_seconds_total"]:.4f}', flush=True)
        last = now
PY
    sampler=$!
    sleep 1
    taskset -c 1 "$SNAP_BIN" load --url "http://127.0.0.1:$PORT" --keys "$n" --mix ingest:100 \
        --rate "$((n / 100))" --connections 8 --duration "${INTERVALS}s" --quiet \
        --json "$dir/ingest.json" >/dev/null
    wait "$sampler"
    kill -9 "$PID"
    wait "$PID" 2>/dev/null || true
    deltas=$(ls "$dir" | grep -c '^boxes\.snap\.d[0-9]*$' || true)
    # Restart from the chain (kill -9: re-stamped), then a graceful stop
    # writes one full base of the same table; restart from it alone.
    # Restart from the chain (after a kill -9: versions re-stamped), then a
    # graceful stop writes one full base of the same table: the load of each
    # is timed with `pollbox check-config`, which loads the snapshot as a
    # start does and stops there (wall and CPU seconds).
    sed "s#$dir/boxes.snap#$dir/run/boxes.snap#" "$cfg" >"$dir/run.toml"
    rm -rf "$dir/run"; mkdir -p "$dir/run"
    cp "$dir"/boxes.snap* "$dir/run/"
    sed "s#$dir/boxes.snap#$dir/full/boxes.snap#" "$cfg" >"$dir/full.toml"
    rm -rf "$dir/full"; mkdir -p "$dir/full"
    start "$dir/run.toml"
    kill -INT "$PID"; wait "$PID" || true
    mv "$dir/run/boxes.snap" "$dir/full/boxes.snap"
    rm -f "$dir/run"/boxes.snap*
    cp "$dir"/boxes.snap* "$dir/run/"
    test "$(ls "$dir/full" | grep -c '^boxes\.snap\.d' || true)" = 0
    chain_loads=() chain_cpu=() full_loads=() full_cpu=()
    for _ in $(seq "$LOADS"); do
        for kind in run full; do
            read -r wall user sys < <(taskset -c 0 /usr/bin/time -f "%e %U %S" \
                "$SNAP_BIN" check-config "$dir/$kind.toml" 2>&1 >/dev/null | tail -1)
            cpu=$(python3 -c "print(f'{$user + $sys:.2f}')")
            if [[ $kind == run ]]; then chain_loads+=("$wall"); chain_cpu+=("$cpu")
            else full_loads+=("$wall"); full_cpu+=("$cpu"); fi
        done
    done
    python3 - "$n" "$rss0" "$rss" "$full_bytes" "$dir/writes.txt" "$deltas" "${chain_loads[*]}" "${full_loads[*]}" "${chain_cpu[*]}" "${full_cpu[*]}" <<'PY'
import sys, statistics as st
n, rss0, rss, full = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
writes = [l.split() for l in open(sys.argv[5]) if l.strip()]
chain = [float(x) for x in sys.argv[7].split()]
fullv = [float(x) for x in sys.argv[8].split()]
# Writes of 0 bytes are the idle seconds before and after the updates.
writes = [w for w in writes if int(w[2]) > 0]
bases = [(int(b), float(s)) for k, c, b, s in writes if k == "base"]
deltas = [(int(b), float(s)) for k, c, b, s in writes if k == "delta"]
count = sum(int(c) for k, c, b, s in writes)
total = sum(int(b) for k, c, b, s in writes)
per = total / max(count, 1)
fb = st.mean(b for b, s in bases) if bases else full
fs = st.mean(s for b, s in bases) if bases else float("nan")
db = st.mean(b for b, s in deltas) if deltas else 0
ds = st.mean(s for b, s in deltas) if deltas else float("nan")
mc, mf = st.median(chain), st.median(fullv)
print(f"{n:9d} {(rss - rss0) / n:8.1f} {int(fb):11d} {fs:7.3f} {int(db):9d} {ds:7.4f} {int(per):11d} {100 * per / full:5.1f}% "
      f"{mc:6.3f} ({min(chain):.3f}-{max(chain):.3f}) {mf:6.3f} ({min(fullv):.3f}-{max(fullv):.3f}) {mc / mf:5.2f}x")
cc = [float(x) for x in sys.argv[9].split()]
fc = [float(x) for x in sys.argv[10].split()]
print(f"#   {n}: load CPU s (user+sys, median and range): chain {st.median(cc):.2f} ({min(cc):.2f}-{max(cc):.2f}), "
      f"full {st.median(fc):.2f} ({min(fc):.2f}-{max(fc):.2f}), ratio {st.median(cc) / st.median(fc):.2f}x", file=sys.stderr)
print(f"#   {n}: {count} writes ({len(bases)} bases, {len(deltas)} deltas; {sys.argv[6]} delta files at the kill), "
      f"full snapshot {full} B", file=sys.stderr)
PY
done
