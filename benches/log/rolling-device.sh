#!/usr/bin/env bash
# benches/log/rolling-device.sh BUNDLE.tar.xz [OUT_DIR]: benches/log/rolling.sh on a
# bare machine, from what benches/log/bundle.sh packed (Java, the Kafka jars,
# HAProxy, pollbox). Stand-ins for curl when it is missing. Knobs as rolling.sh's
# (ROLLING_RATE ...). Copies the result file (and the kept work folder's logs,
# as a .tgz) to OUT_DIR if given.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ $# -ge 1 ]] || { echo "usage: $0 BUNDLE.tar.xz [OUT_DIR]" >&2; exit 2; }
# shellcheck source=bundle-env.sh
. "$ROOT/benches/log/bundle-env.sh" "$1"
OUT_DIR="${2:-}"
echo "# rolling-device.sh: $(nproc) cores, java $(java -version 2>&1 | head -1), $(haproxy -v | head -1)"
cd "$ROOT"
set +e
ROLLING_KEEP=1 benches/log/rolling.sh 2>&1 | tee "$B/rolling.log"
rc=${PIPESTATUS[0]}
set -e
if [[ -n "$OUT_DIR" ]]; then
  mkdir -p "$OUT_DIR"
  res="$(sed -n 's/^raw output: //p' "$B/rolling.log" | tail -1)"
  [[ -n "$res" && -f "$res" ]] && cp "$res" "$OUT_DIR/"
  work="$(sed -n 's/^rolling.sh: kept //p' "$B/rolling.log" | tail -1)"
  [[ -n "$work" && -d "$work" ]] && tar -C "$work" -czf "$OUT_DIR/rolling-work.tgz" \
    --exclude='kafka/*/data' --exclude='*.snapshot*' --exclude=bin . 2>/dev/null
  cp "$B/rolling.log" "$OUT_DIR/"
fi
exit "$rc"
