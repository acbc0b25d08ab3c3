#!/usr/bin/env bash
# What placing connections by load costs where connections are short-lived: a new
# connection for every request (benches/scaling/churn.c) against W workers, the kernel's
# SO_REUSEPORT hash alone (place_by_load = false) against placement by load, one build,
# interleaved. Prints connections/s and the server's CPU per connection.
#
#   benches/scaling/churn.sh        # a 2-core machine: server on CPU 0, client on CPU 1
#
# Knobs: CHURN_WORKERS (2), CHURN_SERVER_CPUS (0), CHURN_CLIENT_CPUS (1),
# CHURN_THREADS (client threads, 2), CHURN_DURATION (s, 5), CHURN_REPS (3),
# CHURN_POLLBOX (binary; default this tree's release build), CHURN_OUT (raw folder).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=benches/scaling/lib.sh
. "$ROOT/benches/scaling/lib.sh"
W=${CHURN_WORKERS:-2}
SERVER_CPUS=${CHURN_SERVER_CPUS:-0}
CLIENT_CPUS=${CHURN_CLIENT_CPUS:-1}
THREADS=${CHURN_THREADS:-2}
DUR=${CHURN_DURATION:-5}
REPS=${CHURN_REPS:-3}
OUTDIR=${CHURN_OUT:-$(mktemp -d /tmp/pollbox-churn.XXXXXX)}
mkdir -p "$OUTDIR"
prepare_server "$OUTDIR" "${CHURN_POLLBOX:-}"
SCALE_PLACEMENT="hash" pinned_config "$OUTDIR/hash.toml"
cp "$CFG" "$OUTDIR/load.toml"
cc -O2 -pthread -o "$OUTDIR/churn" "$ROOT/benches/scaling/churn.c"
{
    run_header churn.sh
    echo "# $W workers on $SERVER_CPUS; $THREADS client threads on $CLIENT_CPUS, a connection per GET /healthz; ${DUR}s; reps $REPS"
} | tee "$OUTDIR/header.txt"
port=19800
for rep in $(seq 1 "$REPS"); do
    for mode in hash load; do
        port=$((port + 1))
        CFG=$OUTDIR/$mode.toml
        start_server "$SERVER_CPUS" "$port" "$W" "$OUTDIR/$mode-r$rep.server.log"
        c0=$(cpu_ticks "$SRV")
        out=$(taskset -c "$CLIENT_CPUS" "$OUTDIR/churn" "$port" "$THREADS" "$DUR")
        c1=$(cpu_ticks "$SRV")
        stop_server
        rate=${out%% *}
        echo "$mode rep $rep  $out  server $(python3 -c "import sys; t, hz, r, d = map(float, sys.argv[1:]); print(f'{t / hz / d:.2f} cores, {t / hz * 1e6 / (r * d):.1f} us a connection')" "$((c1 - c0))" "$HZ" "$rate" "$DUR")"
    done
done | tee "$OUTDIR/lines.txt"
echo "# raw: $OUTDIR"
