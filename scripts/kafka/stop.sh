#!/usr/bin/env bash
# stop.sh DIR [--keep]: stops the broker that start.sh started in DIR (by the
# pid in DIR/kafka.pid: SIGTERM, then SIGKILL after KAFKA_STOP_TIMEOUT=15 s) and removes DIR,
# unless --keep is given (to read DIR/server.log afterwards). For a cluster
# (start.sh --brokers N) it stops every broker of DIR (DIR/b1 ... DIR/bN) at once:
# with SIGKILL when DIR is removed anyway (SIGTERM would wait ~5 s for a quorum
# that is stopping too), with SIGTERM as above when --keep is given.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
dir="${1:?usage: stop.sh DIR [--keep]}"
keep=false
[[ "${2:-}" == "--keep" ]] && keep=true

if [[ ! -f "$dir/server.properties" && ! -f "$dir/b1/server.properties" ]]; then
  echo "stop.sh: $dir was not made by start.sh (no server.properties)" >&2
  exit 1
fi
dir="$(cd "$dir" && pwd)"
# The brokers of DIR: itself, or its b1 ... bN.
brokers=("$dir") sig=TERM
if [[ ! -f "$dir/server.properties" ]]; then
  brokers=("$dir"/b[0-9]*)
  $keep || sig=KILL
fi
pids=()
for b in "${brokers[@]}"; do
  [[ -s "$b/kafka.pid" ]] || continue
  pid="$(cat "$b/kafka.pid")"
  # Only signal the pid if it is still our broker (the pid may have been reused).
  if kill -0 "$pid" 2>/dev/null \
      && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$b/server.properties"; then
    kill -CONT "$pid" 2>/dev/null || true   # a paused broker (broker.sh pause) cannot stop
    kill -s "$sig" "$pid" 2>/dev/null || true
    pids+=("$pid")
  fi
done
alive() {
  local pid
  for pid in "${pids[@]+"${pids[@]}"}"; do pid_runs "$pid" && return 0; done
  return 1
}
t="${KAFKA_STOP_TIMEOUT:-15}"
for _ in $(seq $((t * 10))); do alive || break; sleep 0.1; done
if alive; then
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: broker $pid did not stop in $t s; killing it" >&2
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  for _ in $(seq 50); do alive || break; sleep 0.1; done
fi
$keep || rm -rf "$dir"
