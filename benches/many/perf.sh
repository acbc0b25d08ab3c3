#!/usr/bin/env bash
# Where the CPU of a delivered event goes, one-box streams against streams of 64
# boxes: the events part of benches/many/run.sh (1,000 subscribers, 20 posts/s to
# box-63 for 10 s, one round of single and many) with `perf record -e cpu-clock`
# on the server over each window, then the top symbols and the user/kernel split.
#
#   bash benches/many/perf.sh          # POLLBOX_BIN=path: that binary, not a build here
#
# Writes benches/many/results/<date>-events-perf.txt. perf adds its own CPU on
# CPU 1 (the client's); the server's CPU per event is within a few % of run.sh's.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
D=$(mktemp -d /tmp/many-perf.XXXXXX)
trap 'rm -rf "$D"' EXIT
if [ -z "${POLLBOX_BIN:-}" ]; then
    cargo build --release -q -p pollbox
    REV="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo '+changes')"
    cp target/release/pollbox "$D/pollbox"
else
    REV=${POLLBOX_REV:-"binary $POLLBOX_BIN"}
    cp "$POLLBOX_BIN" "$D/pollbox"
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
OUT=benches/many/results/$(date -u +%F)-events-perf.txt
{
    echo "# bash benches/many/perf.sh $(date -u +%FT%TZ) on $(hostname): $(nproc) cores, $(uname -r); pollbox $REV"
    taskset -c 1 python3 benches/many/many.py events --bin "$D/pollbox" --root "$ROOT" \
        --subs 1000 --rate 20 --seconds 10 --reps 1 --kinds single,many --perf "$D"
    for k in single many; do
        perf report -i "$D/$k-1.data" --no-children --sort dso --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' >"$D/$k.dso" || true
        perf report -i "$D/$k-1.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' >"$D/$k.sym" || true
        echo "## $k: perf report --sort dso (the server over the window; $(grep -c . "$D/$k.sym") symbols)"
        head -6 "$D/$k.dso"
        echo "## $k: top symbols"
        head -25 "$D/$k.sym"
        echo "## $k: top user-space symbols"
        grep -F '[.]' "$D/$k.sym" | head -15
    done
} 2>&1 | tee "$OUT"
