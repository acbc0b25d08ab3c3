#!/usr/bin/env bash
# stop.sh DIR [--keep]: stops the broker that start.sh started in DIR (by the
# pid in DIR/kafka.pid: SIGTERM, then SIGKILL after KAFKA_STOP_TIMEOUT=15 s) and removes DIR,
# unless --keep is given (to read DIR/server.log afterwards).
set -euo pipefail
dir="${1:?usage: stop.sh DIR [--keep]}"
keep=false
[[ "${2:-}" == "--keep" ]] && keep=true

if [[ ! -f "$dir/server.properties" ]]; then
  echo "stop.sh: $dir was not made by start.sh (no server.properties)" >&2
  exit 1
fi
dir="$(cd "$dir" && pwd)"
if [[ -s "$dir/kafka.pid" ]]; then
  pid="$(cat "$dir/kafka.pid")"
  # Only signal the pid if it is still our broker (the pid may have been reused).
  if kill -0 "$pid" 2>/dev/null \
      && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir/server.properties"; then
    kill "$pid" 2>/dev/null || true
    t="${KAFKA_STOP_TIMEOUT:-15}"
    for _ in $(seq $((t * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: broker $pid did not stop in $t s; killing it" >&2
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  fi
fi
$keep || rm -rf "$dir"
